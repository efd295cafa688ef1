//! `lockstep train`: MNIST with a built-in model, as a thin layer over the core Trainer.

mod args;
mod download;
mod progress;
mod setup;
mod summary;

use std::sync::Arc;

use anyhow::Context;
use lockstep_core::data::mnist::{Mnist, Split};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset};
use lockstep_core::train::{JsonlWriter, ModelCheckpoint, Monitor, Trainer};

pub use args::Args;

pub fn run(args: Args) -> anyhow::Result<()> {
    args.validate()?;
    super::threads::init(args.threads)?;
    let data_dir = args.data_dir();
    if args.download {
        download::fetch_missing(&data_dir, &args.download_url, &download::CONTENT_SHA256, !args.headless)?;
    }
    let train_set = Mnist::load(&data_dir, Split::Train).with_context(|| missing_data_hint(&data_dir))?;
    let test_set: Arc<dyn Dataset> =
        Arc::new(Mnist::load(&data_dir, Split::Test).with_context(|| missing_data_hint(&data_dir))?);
    let mut setup = setup::build(&args)?;

    let loader_config = DataLoaderConfig {
        batch_size: args.batch_size,
        num_workers: args.workers,
        ..Default::default()
    };
    let train = DataLoader::simple(Arc::new(train_set), !args.no_shuffle, args.seed, loader_config.clone())?;
    let eval_config = DataLoaderConfig {
        batch_size: 1000,
        ..loader_config
    };
    let test = DataLoader::simple(test_set, false, 0, eval_config)?;

    let mut trainer = Trainer::new(args.trainer_config())?;
    if let Some(path) = &args.metrics_out {
        trainer.add_listener(JsonlWriter::create(path)?);
    }
    trainer.add_listener(progress::ProgressBar::new(args.headless));
    if let Some(dir) = &args.checkpoint_dir {
        // Without validation there is no val_acc to rank by (the run would fail at the first
        // epoch end): keep only last.safetensors.
        let checkpoint = ModelCheckpoint::new(dir);
        trainer.add_callback(if args.no_val {
            checkpoint
        } else {
            checkpoint.monitor(Monitor::max("val_acc"), 1)
        });
    }
    if let Some(path) = &args.resume {
        trainer
            .resume(&mut setup, path)
            .with_context(|| format!("cannot resume from {}", path.display()))?;
    }
    let report = trainer.fit(&mut setup, &train, (!args.no_val).then_some(&test))?;
    let result = trainer.test(&mut setup, &test)?;
    let summary = summary::Summary::new(&args, setup.device.location(), &report, &result);
    summary.print();
    if let Some(path) = &args.summary_out {
        summary.write(path)?;
    }
    Ok(())
}

fn missing_data_hint(dir: &std::path::Path) -> String {
    format!(
        "cannot read MNIST from {}: put the four standard files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) there, or pass --data DIR (or set LOCKSTEP_DATA), or add --download to fetch them",
        dir.display()
    )
}
