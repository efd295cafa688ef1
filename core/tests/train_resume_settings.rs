//! A resumed run that would not continue the checkpoint's trajectory is refused before its
//! first step, with one error naming every difference (old and new value) and the override;
//! the override lets it go on; every resumed run says where it resumed from. Settings an older
//! checkpoint did not record are not held against it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lockstep_core::Device;
use lockstep_core::train::{
    Event, ModelCheckpoint, Precision, Progress, Record, ResumeSetting, Trainer, TrainerConfig, checkpoint,
};

mod scratch_support;
mod tiny_run_support;
use scratch_support::Scratch;
use tiny_run_support::{loader, setup};

fn config(max_steps: u64, accumulate: usize) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 4,
        max_steps: Some(max_steps),
        accumulate_grad_batches: accumulate,
        progress: Progress::Off,
        ..Default::default()
    }
}

/// A checkpoint after 2 steps of the scheduled setup, batch 8, accumulating 2.
fn checkpoint_after_two_steps(dir: &Path) -> PathBuf {
    let mut trainer = Trainer::new(config(2, 2)).unwrap();
    trainer.add_callback(ModelCheckpoint::new(dir));
    trainer.fit(&mut setup(true, 2), &loader(8), None).unwrap();
    dir.join("last.safetensors")
}

/// A trainer that keeps its events, and those events.
fn listening(config: TrainerConfig) -> (Trainer, Arc<Mutex<Vec<Event>>>) {
    let mut trainer = Trainer::new(config).unwrap();
    let events = Arc::new(Mutex::new(Vec::new()));
    let heard = events.clone();
    trainer.add_listener(move |r: &Record| {
        heard.lock().unwrap().push(r.event.clone());
        Ok(())
    });
    (trainer, events)
}

fn resumed_events(events: &Mutex<Vec<Event>>) -> Vec<Event> {
    let events = events.lock().unwrap();
    events
        .iter()
        .filter(|e| matches!(e, Event::Resumed { .. }))
        .cloned()
        .collect()
}

#[test]
fn a_resume_into_another_setup_is_refused_naming_each_difference() {
    let scratch = Scratch::new("resume-settings");
    let last = checkpoint_after_two_steps(&scratch.join("checkpoints"));

    // No schedule, bf16, no accumulation, batch 16, another dropout seed: five differences.
    let mut changed = setup(false, 7);
    let (mut trainer, events) = listening(TrainerConfig {
        precision: Precision::MixedBf16,
        ..config(4, 1)
    });
    trainer.resume(&mut changed, &last).unwrap();
    let err = trainer.fit(&mut changed, &loader(16), None).unwrap_err().to_string();
    for expected in [
        "last.safetensors",
        "schedule: StepLR { step_size: 2, gamma: 0.5 }, stepped per epoch in the checkpoint, constant in this run",
        "precision: 32 in the checkpoint, bf16-mixed in this run",
        "accumulate_grad_batches: 2 in the checkpoint, 1 in this run",
        "batch_size: 8 in the checkpoint, 16 in this run",
        "seed: [2] in the checkpoint, [7] in this run",
        "TrainerConfig::resume_overrides",
        "--resume-override schedule,precision,accumulate_grad_batches,batch_size,seed",
    ] {
        assert!(err.contains(expected), "`{expected}` not in: {err}");
    }
    assert!(!err.contains("world_size"), "the world size did not change: {err}");
    assert!(
        events.lock().unwrap().iter().all(|e| !matches!(e, Event::Step { .. })),
        "a refused run took a step"
    );

    // Accepted on purpose, the changes are named and the run goes on from step 2.
    let mut changed = setup(false, 2);
    let (mut trainer, events) = listening(TrainerConfig {
        resume_overrides: vec![ResumeSetting::Schedule, ResumeSetting::Accumulation],
        ..config(4, 1)
    });
    trainer.resume(&mut changed, &last).unwrap();
    let report = trainer.fit(&mut changed, &loader(8), None).unwrap();
    assert_eq!(report.steps, 4);
    let resumed = resumed_events(&events);
    let [
        Event::Resumed {
            path,
            epoch,
            step,
            changed,
        },
    ] = resumed.as_slice()
    else {
        panic!("one resumed event: {resumed:?}")
    };
    assert_eq!((path.ends_with("last.safetensors"), *epoch, *step), (true, 0, 2));
    assert_eq!(
        changed.as_slice(),
        [
            "schedule StepLR { step_size: 2, gamma: 0.5 }, stepped per epoch -> constant",
            "accumulate_grad_batches 2 -> 1"
        ]
    );
}

#[test]
fn a_faithful_resume_says_where_it_resumed_from() {
    let scratch = Scratch::new("resume-faithful");
    let last = checkpoint_after_two_steps(&scratch.join("checkpoints"));
    let mut same = setup(true, 2);
    let (mut trainer, events) = listening(config(3, 2));
    trainer.resume(&mut same, &last).unwrap();
    trainer.fit(&mut same, &loader(8), None).unwrap();
    let resumed = resumed_events(&events);
    assert!(
        matches!(resumed.as_slice(), [Event::Resumed { epoch: 0, step: 2, changed, .. }] if changed.is_empty()),
        "{resumed:?}"
    );
    // A fresh run says nothing of the kind.
    let (mut trainer, events) = listening(config(1, 2));
    trainer.fit(&mut setup(true, 2), &loader(8), None).unwrap();
    assert!(resumed_events(&events).is_empty());
}

#[test]
fn an_older_checkpoint_is_held_only_to_what_it_recorded() {
    let scratch = Scratch::new("resume-older");
    let last = checkpoint_after_two_steps(&scratch.join("checkpoints"));
    // The checkpoint as a version before the run's settings were recorded wrote it.
    let mut file = checkpoint::load_tensors(&last).unwrap();
    let key = "lockstep.trainer_state";
    let mut state: serde_json::Value = serde_json::from_str(&file.metadata[key]).unwrap();
    assert!(state.as_object_mut().unwrap().remove("run").is_some(), "{state}");
    file.metadata.insert(key.into(), state.to_string());
    let device = Device::cpu();
    let tensors: Vec<_> = file
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.to_device(&device).unwrap()))
        .collect();
    let older = scratch.join("older.safetensors");
    checkpoint::save_tensors(&older, &tensors, file.metadata.clone()).unwrap();

    // Accumulation and batch were not recorded: not compared.
    let mut changed = setup(true, 2);
    let mut trainer = Trainer::new(config(3, 1)).unwrap();
    trainer.resume(&mut changed, &older).unwrap();
    trainer.fit(&mut changed, &loader(16), None).unwrap();
    // That it had a schedule was: resuming at a constant rate is still refused.
    let mut unscheduled = setup(false, 2);
    let mut trainer = Trainer::new(config(3, 2)).unwrap();
    trainer.resume(&mut unscheduled, &older).unwrap();
    let err = trainer.fit(&mut unscheduled, &loader(8), None).unwrap_err().to_string();
    assert!(
        err.contains("schedule: a schedule (not recorded) in the checkpoint, constant in this run"),
        "{err}"
    );
}
