//! `ModelCheckpoint` keeps step- and epoch-numbered checkpoints when asked, named as Lightning
//! names them (`epoch=E-step=S.safetensors`), all of them or the newest K, besides
//! `last.safetensors`; which ones it keeps survives a resume.

use std::path::{Path, PathBuf};

use lockstep_core::train::{Keep, ModelCheckpoint, Progress, Trainer, TrainerConfig};

mod scratch_support;
mod tiny_run_support;
use scratch_support::Scratch;
use tiny_run_support::{loader, setup};

/// The `.safetensors` files in `dir`, by name.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    names.sort();
    names
}

/// Fits the tiny run (8 steps an epoch) to `max_steps` with `checkpoint`, resuming from
/// `resume` if given; returns the checkpoint's kept numbered files.
fn fit(checkpoint: ModelCheckpoint, max_steps: u64, resume: Option<&Path>) -> Vec<PathBuf> {
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 10,
        max_steps: Some(max_steps),
        progress: Progress::Off,
        ..Default::default()
    })
    .unwrap();
    trainer.add_callback(checkpoint);
    let mut s = setup(true, 2);
    if let Some(path) = resume {
        trainer.resume(&mut s, path).unwrap();
    }
    trainer.fit(&mut s, &loader(8), None).unwrap();
    trainer.callback::<ModelCheckpoint>().unwrap().numbered().to_vec()
}

#[test]
fn every_n_train_steps_keeps_all_numbered_checkpoints() {
    let scratch = Scratch::new("numbered-all");
    let dir = scratch.join("checkpoints");
    let kept = fit(
        ModelCheckpoint::new(&dir)
            .every_n_train_steps(3)
            .keep_numbered(Keep::All),
        10,
        None,
    );
    // Steps 3 and 6 in epoch 0 (of 8 steps), 9 in epoch 1.
    let expected = [
        "epoch=0-step=3.safetensors",
        "epoch=0-step=6.safetensors",
        "epoch=1-step=9.safetensors",
        "last.safetensors",
    ];
    assert_eq!(files(&dir), expected);
    assert_eq!(kept, expected[..3].iter().map(|n| dir.join(n)).collect::<Vec<_>>());
}

#[test]
fn the_last_k_are_kept_across_a_resume() {
    let scratch = Scratch::new("numbered-last");
    let dir = scratch.join("checkpoints");
    let keep_two = || {
        ModelCheckpoint::new(&dir)
            .every_n_train_steps(2)
            .keep_numbered(Keep::Last(2))
    };
    fit(keep_two(), 6, None);
    assert_eq!(
        files(&dir),
        [
            "epoch=0-step=4.safetensors",
            "epoch=0-step=6.safetensors",
            "last.safetensors"
        ]
    );
    // The resumed run knows the files the first one kept, and prunes them as it goes.
    let resumed = fit(keep_two(), 10, Some(&dir.join("last.safetensors")));
    assert_eq!(
        files(&dir),
        [
            "epoch=0-step=8.safetensors",
            "epoch=1-step=10.safetensors",
            "last.safetensors"
        ]
    );
    assert_eq!(
        resumed,
        [
            dir.join("epoch=0-step=8.safetensors"),
            dir.join("epoch=1-step=10.safetensors")
        ]
    );
}

#[test]
fn numbered_checkpoints_default_to_every_epoch_or_every_n_epochs() {
    let scratch = Scratch::new("numbered-epochs");
    let every_epoch = scratch.join("every");
    fit(ModelCheckpoint::new(&every_epoch).keep_numbered(Keep::All), 16, None);
    assert_eq!(
        files(&every_epoch),
        [
            "epoch=0-step=8.safetensors",
            "epoch=1-step=16.safetensors",
            "last.safetensors"
        ]
    );
    let second = scratch.join("second");
    fit(
        ModelCheckpoint::new(&second).every_n_epochs(2).keep_numbered(Keep::All),
        24,
        None,
    );
    assert_eq!(files(&second), ["epoch=1-step=16.safetensors", "last.safetensors"]);
    assert!(Keep::parse("0").is_err() && Keep::parse("all").unwrap() == Keep::All);
    assert_eq!(Keep::parse("3").unwrap(), Keep::Last(3));
}
