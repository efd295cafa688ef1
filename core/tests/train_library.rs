//! A newcomer's program through the library: a model written as fields and a forward, data held
//! in memory, the setup builder, a closure listening to the run, and the checkpoint callback
//! asked for its best file after `fit`. It learns, and nothing had to be threaded by hand.

use std::sync::{Arc, Mutex};

use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::{Dropout, Linear, Module, ModuleExt, Relu};
use lockstep_core::optim::{Adam, AdamConfig};
use lockstep_core::train::{
    ConsoleProgress, Event, ModelCheckpoint, Monitor, Progress, Record, Trainer, TrainerConfig, TrainingSetup,
};
use lockstep_core::{Device, Generator, HostVec, Result, Tensor};

mod scratch_support;
use scratch_support::Scratch;

#[derive(Module)]
struct Classifier {
    hidden: Linear,
    act: Relu,
    dropout: Dropout,
    out: Linear,
}

impl Classifier {
    fn new(generator: &Generator) -> Result<Classifier> {
        let device = Device::cpu();
        Ok(Classifier {
            hidden: Linear::new(2, 32, true, &device, generator)?,
            act: Relu,
            dropout: Dropout::new(0.1, Arc::new(Generator::new(9)))?,
            out: Linear::new(32, 2, true, &device, generator)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.act.forward(&self.hidden.forward(x)?)?;
        self.out.forward(&self.dropout.forward(&h)?)
    }
}

/// `n` points in the plane, labelled by whether they lie inside the unit circle.
fn circle(n: usize, seed: u64) -> Arc<TensorDataset> {
    let points: Vec<f32> = (0..2 * n)
        .map(|i| lockstep_core::rng::uniform_at(seed, i as u64, 0) as f32 * 3.0 - 1.5)
        .collect();
    let labels: Vec<u32> = points
        .chunks(2)
        .map(|p| u32::from(p[0] * p[0] + p[1] * p[1] < 1.0))
        .collect();
    Arc::new(
        TensorDataset::new(vec![
            HostTensor::new(HostVec::F32(points), [n, 2]).unwrap(),
            HostTensor::new(HostVec::U32(labels), [n]).unwrap(),
        ])
        .unwrap(),
    )
}

#[test]
fn a_custom_model_on_in_memory_data_trains_in_a_few_lines() {
    let scratch = Scratch::new("library");
    let dir = scratch.join("checkpoints");
    let config = DataLoaderConfig {
        batch_size: 32,
        ..Default::default()
    };
    let train = DataLoader::simple(circle(512, 1), true, 0, config.clone()).unwrap();
    let val = DataLoader::simple(circle(256, 2), false, 0, config).unwrap();

    let model = Classifier::new(&Generator::new(0)).unwrap();
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2)).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer).name("circle");
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 8,
        ..Default::default()
    })
    .unwrap();
    let steps = Arc::new(Mutex::new(0u64));
    let seen = steps.clone();
    trainer.add_listener(move |r: &Record| {
        if matches!(r.event, Event::Step { .. }) {
            *seen.lock().unwrap() += 1;
        }
        Ok(())
    });
    trainer.add_callback(ModelCheckpoint::new(&dir).monitor(Monitor::max("val_acc"), 1));
    let report = trainer.fit(&mut setup, &train, Some(&val)).unwrap();

    assert_eq!(report.steps, 8 * 16);
    assert!(*steps.lock().unwrap() > 0, "the closure heard no step");
    let accuracy = report.last_val.expect("validated").accuracy;
    assert!(accuracy > 0.85, "validation accuracy {accuracy}");
    // The callback is still there to ask, and its best file exists.
    let checkpoint = trainer.callback::<ModelCheckpoint>().expect("the checkpoint callback");
    let (best, path) = checkpoint.best().expect("a best checkpoint");
    assert!(
        best >= accuracy - 1e-9 && path.is_file(),
        "{best} at {}",
        path.display()
    );
    // The model's Dropout stream travelled with the checkpoint without being registered.
    assert_eq!(setup.random_streams().len(), 1);

    // The best checkpoint, loaded into a fresh model, is scored without an optimizer or a
    // hand loop, and as the run scored it.
    let mut loaded = Classifier::new(&Generator::new(5)).unwrap();
    loaded.load(path).unwrap();
    let mut scorer = Trainer::new(TrainerConfig {
        progress: Progress::Off,
        ..Default::default()
    })
    .unwrap();
    let validated = scorer.validate(&mut loaded, &val).unwrap();
    assert!((validated.accuracy - best).abs() < 1e-9, "{validated:?} vs best {best}");
    let tested = scorer.test(&mut loaded, &val).unwrap();
    assert_eq!(tested, validated);
    // With a task named, as a language model would be scored.
    let mut pair = (loaded, lockstep_core::train::Classification);
    assert_eq!(scorer.test(&mut pair, &val).unwrap(), validated);
}

/// A writer the test can read back after the Trainer has written to it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_console_view_prints_the_run_its_epochs_and_its_checkpoints() {
    let scratch = Scratch::new("console");
    let dir = scratch.join("checkpoints");
    let config = DataLoaderConfig {
        batch_size: 64,
        ..Default::default()
    };
    let train = DataLoader::simple(circle(256, 1), true, 0, config.clone()).unwrap();
    let val = DataLoader::simple(circle(128, 2), false, 0, config).unwrap();
    let model = Classifier::new(&Generator::new(0)).unwrap();
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2)).unwrap();
    let mut setup = TrainingSetup::new(model, optimizer).name("circle");
    // The default view writes to stderr; this one writes the same lines where the test reads.
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 2,
        progress: Progress::Off,
        ..Default::default()
    })
    .unwrap();
    let printed = Captured::default();
    trainer.add_listener(ConsoleProgress::lines_to(printed.clone()));
    trainer.add_callback(ModelCheckpoint::new(&dir));
    trainer.fit(&mut setup, &train, Some(&val)).unwrap();

    let text = String::from_utf8(printed.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "training circle on cpu:0 (4 steps per epoch)", "{text}");
    // Epochs count from 0 here, as Lightning's `current_epoch` and its progress bar do.
    for epoch in 0..2 {
        let line = format!("epoch {epoch}: train loss ");
        assert!(
            lines.iter().any(|l| l.starts_with(&line) && l.contains("val acc")),
            "no `{line}…val acc` in:\n{text}"
        );
    }
    assert!(lines.iter().any(|l| l.starts_with("checkpoint (")), "{text}");
}
