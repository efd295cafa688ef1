//! A run interrupted mid-epoch and resumed from its checkpoint ends with the same weights, bit
//! for bit, as one that was not interrupted (CPU backend): on plain points, and on images that
//! the loader's workers crop and flip at random (each draw a function of seed, epoch and index).

use std::sync::Arc;

use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::{
    DataLoader, DataLoaderConfig, Dataset, HostTensor, ImageClassification, ImageSource, Sample,
};
use lockstep_core::nn::{Dropout, Flatten, Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig, StepLR};
use lockstep_core::train::{
    GradientClip, ModelCheckpoint, OnWriteError, SchedulerInterval, Trainer, TrainerConfig, TrainingSetup,
};
use lockstep_core::{Device, Generator, HostVec, Result};

mod scratch_support;
use scratch_support::Scratch;

/// 150 points in 8-D whose label is the index of their largest coordinate among the first 3.
struct Blobs;

impl Dataset for Blobs {
    fn len(&self) -> usize {
        150
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let x: Vec<f32> = (0..8)
            .map(|j| lockstep_core::rng::uniform_at(99, i as u64, j) as f32 * 2.0 - 1.0)
            .collect();
        let label = (0..3).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap_or(0) as u32;
        Ok(vec![
            HostTensor::new(HostVec::F32(x), [8])?,
            HostTensor::new(HostVec::U32(vec![label]), [])?,
        ])
    }
}

/// 150 3x8x8 images whose class (of 3) tints them, with a grain that differs per image.
struct Tinted;

impl ImageSource for Tinted {
    fn len(&self) -> usize {
        150
    }
    fn shape(&self) -> [usize; 3] {
        [3, 8, 8]
    }
    fn classes(&self) -> usize {
        3
    }
    fn read(&self, index: usize, out: &mut [u8]) -> Result<u32> {
        let class = index % 3;
        for (p, v) in out.iter_mut().enumerate() {
            let tint = if p / 64 == class { 160 } else { 40 };
            *v = (tint + (p * 37 + index * 11) % 64) as u8;
        }
        Ok(class as u32)
    }
}

fn tinted_images() -> Arc<dyn Dataset> {
    let augment = Augment {
        crop_padding: Some(2),
        horizontal_flip: true,
    };
    let normalize = Normalize::new(&[0.5; 3], &[0.25; 3]);
    Arc::new(ImageClassification::new(Arc::new(Tinted), augment, normalize, 3).unwrap())
}

/// The model's Dropout owns its stream: the Trainer finds it for the checkpoint by itself.
fn setup() -> TrainingSetup {
    setup_for(8)
}

/// The same MLP over inputs of `features` values.
fn setup_for(features: usize) -> TrainingSetup {
    let device = Device::cpu();
    let init = Generator::new(1);
    let model = Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(features, 16, true, &device, &init).unwrap())
        .add(Relu)
        .add(Dropout::new(0.2, Arc::new(Generator::new(2))).unwrap())
        .add(Linear::new(16, 3, true, &device, &init).unwrap());
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.1).momentum(0.9).nesterov(true)).unwrap();
    TrainingSetup::new(model, optimizer)
        .schedule(StepLR::new(5, 0.5).unwrap())
        .name("blob-mlp")
}

fn config(max_steps: Option<u64>) -> TrainerConfig {
    TrainerConfig {
        max_epochs: 3,
        max_steps,
        accumulate_grad_batches: 2,
        gradient_clip: Some(GradientClip::Norm(1.0)),
        scheduler_interval: SchedulerInterval::Step,
        log_every_n_steps: 1,
        ..Default::default()
    }
}

fn loader() -> DataLoader {
    loader_of(Arc::new(Blobs))
}

fn loader_of(data: Arc<dyn Dataset>) -> DataLoader {
    DataLoader::simple(
        data,
        true,
        5,
        DataLoaderConfig {
            batch_size: 16,
            num_workers: 2,
            ..Default::default()
        },
    )
    .unwrap()
}

fn weights(s: &TrainingSetup) -> Vec<(String, Vec<u32>)> {
    s.model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()))
        .collect()
}

#[test]
fn interrupted_and_resumed_equals_uninterrupted_bit_for_bit() {
    resumed_run_equals_uninterrupted("points", Arc::new(Blobs), 8);
}

#[test]
fn resuming_mid_epoch_replays_the_same_random_crops_and_flips() {
    resumed_run_equals_uninterrupted("augmented", tinted_images(), 3 * 8 * 8);
}

fn resumed_run_equals_uninterrupted(label: &str, data: Arc<dyn Dataset>, features: usize) {
    // The checkpoint callback makes its directory.
    let scratch = Scratch::new(&format!("resume-{label}"));
    let dir = scratch.join("checkpoints");

    let mut straight = setup_for(features);
    let report = Trainer::new(config(None))
        .unwrap()
        .fit(&mut straight, &loader_of(data.clone()), None)
        .unwrap();
    // 10 batches per epoch, accumulate 2: 5 steps per epoch.
    assert_eq!((report.epochs, report.steps), (3, 15));
    assert_eq!(report.epoch_seconds.len(), 3, "one time for each epoch");
    assert!(
        report
            .epoch_seconds
            .iter()
            .all(|&s| s > 0.0 && s <= report.train_seconds)
    );

    // Stop at step 7 (mid-epoch 1); the checkpoint callback saves where it stopped.
    let mut first = setup_for(features);
    let mut trainer = Trainer::new(config(Some(7))).unwrap();
    trainer.add_callback(ModelCheckpoint::new(&dir));
    let partial = trainer.fit(&mut first, &loader_of(data.clone()), None).unwrap();
    assert_eq!((partial.steps, partial.stop_reason.as_str()), (7, "max_steps"));
    assert_eq!(partial.epoch_seconds.len(), 1, "epoch 1 did not end");
    assert_ne!(weights(&first), weights(&straight));

    // A fresh process would rebuild everything from scratch, then resume.
    let mut resumed = setup_for(features);
    let mut trainer = Trainer::new(config(None)).unwrap();
    trainer.resume(&mut resumed, &dir.join("last.safetensors")).unwrap();
    assert_eq!(
        (
            trainer.state().epoch,
            trainer.state().batch_in_epoch,
            trainer.state().global_step
        ),
        (1, 4, 7)
    );
    let rest = trainer.fit(&mut resumed, &loader_of(data), None).unwrap();
    assert_eq!(rest.steps, 15);
    assert_eq!(rest.epoch_seconds.len(), 2, "the resumed epoch 1, then epoch 2");
    assert_eq!(weights(&resumed), weights(&straight));
    assert_eq!(
        rest.last_train_loss.map(f64::to_bits),
        report.last_train_loss.map(f64::to_bits)
    );
}

#[test]
fn a_checkpoint_for_another_model_is_refused_with_the_differences() {
    let scratch = Scratch::new("mismatch");
    let dir = scratch.join("checkpoints");
    let mut s = setup();
    let mut trainer = Trainer::new(config(Some(1))).unwrap();
    trainer.add_callback(ModelCheckpoint::new(&dir));
    trainer.fit(&mut s, &loader(), None).unwrap();

    let device = Device::cpu();
    let init = Generator::new(1);
    let other = Sequential::new()
        .add(Flatten::new())
        .add(Linear::new(8, 32, true, &device, &init).unwrap())
        .add(Relu)
        .add(Dropout::new(0.2, Arc::new(Generator::new(2))).unwrap())
        .add(Linear::new(32, 3, true, &device, &init).unwrap());
    let optimizer = Sgd::new(other.parameters(), SgdConfig::new(0.1)).unwrap();
    let mut wrong = TrainingSetup::new(other, optimizer).schedule(StepLR::new(5, 0.5).unwrap());
    let err = Trainer::new(config(None))
        .unwrap()
        .resume(&mut wrong, &dir.join("last.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1.weight") && err.contains("[32, 8]") && err.contains("[16, 8]"),
        "{err}"
    );

    // A truncated file is reported as such, and the checkpoint on disk is untouched.
    let path = dir.join("last.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = Trainer::new(config(None))
        .unwrap()
        .resume(&mut setup(), &cut)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cut.safetensors") && err.contains("truncated or corrupt"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_paused_run_holds_and_a_stop_ends_it_with_its_checkpoint() {
    use lockstep_core::train::{ChannelListener, Event};
    use std::sync::atomic::{AtomicBool, Ordering};

    let scratch = Scratch::new("pause");
    let dir = scratch.join("checkpoints");
    let (stop, pause) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(true)));
    let (events, rx) = ChannelListener::new(1024);
    let mut trainer = Trainer::new(config(None))
        .unwrap()
        .with_controls(stop.clone(), pause.clone());
    trainer.add_listener(events);
    trainer.add_callback(ModelCheckpoint::new(&dir));
    let run = std::thread::spawn(move || {
        let mut s = setup();
        trainer.fit(&mut s, &loader(), None)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let steps = |rx: &std::sync::mpsc::Receiver<_>| {
        rx.try_iter()
            .filter(|r: &lockstep_core::train::Record| matches!(r.event, Event::Step { .. }))
            .count()
    };
    assert_eq!(steps(&rx), 1, "a paused run took more than the step it was in");
    stop.store(true, Ordering::Relaxed);
    let report = run.join().unwrap().unwrap();
    assert_eq!(report.stop_reason, "stopped by request");
    assert_eq!(report.steps, 1);
    assert!(
        dir.join("last.safetensors").exists(),
        "a stop saves the last checkpoint"
    );
}

/// A killed writer's temporary checkpoint (its process gone) is removed when a checkpoint
/// callback next takes the directory; a live process's is another run's write in progress
/// and stays.
#[test]
fn a_checkpoint_directory_sheds_the_temporaries_of_dead_writers_only() {
    let dir = Scratch::new("stale");
    let dead = (100_000..4_000_000u32)
        .rev()
        .find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .unwrap();
    let live = 1; // init: always running
    for pid in [dead, live] {
        std::fs::write(dir.join(format!(".last.safetensors.tmp-{pid}")), b"partial").unwrap();
    }
    std::fs::write(dir.join("notes.tmp-1"), b"not ours").unwrap();
    let _callback = ModelCheckpoint::new(dir.path());
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [format!(".last.safetensors.tmp-{live}"), "notes.tmp-1".to_string()]
    );
}

/// A checkpoint that cannot be written (here its directory's parent is a file) ends the run
/// with an error that says the previous checkpoint is intact, or under `OnWriteError::Warn` is
/// counted while training goes on.
#[test]
fn a_checkpoint_that_cannot_be_written_stops_the_run_or_only_warns() {
    let dir = Scratch::new("unwritable");
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, b"in the way").unwrap();
    let unwritable = blocker.join("checkpoints");
    let run = |on_error: OnWriteError| {
        let mut setup = setup();
        let mut trainer = Trainer::new(TrainerConfig {
            max_epochs: 2,
            ..config(None)
        })
        .unwrap();
        trainer.add_callback(ModelCheckpoint::new(&unwritable).on_write_error(on_error));
        let result = trainer.fit(&mut setup, &loader(), None);
        (result, trainer.callback::<ModelCheckpoint>().unwrap().failed_writes())
    };
    let (stopped, _) = run(OnWriteError::Stop);
    let err = stopped.unwrap_err().to_string();
    for needle in [
        "checkpoints",
        "the previous checkpoint is intact",
        "--on-checkpoint-error warn",
    ] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    let (warned, failed) = run(OnWriteError::Warn);
    assert_eq!(warned.unwrap().epochs, 2, "training went on");
    assert!(failed >= 2, "each epoch's write failed and was counted: {failed}");
    assert_eq!(std::fs::read(&blocker).unwrap(), b"in the way");
}
