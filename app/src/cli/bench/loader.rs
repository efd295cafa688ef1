//! `lockstep bench loader`: how fast the DataLoader delivers MNIST training batches (batch 128,
//! shuffled, copied to the device as the training loop consumes them) with 0, 1, 2 and 4
//! worker threads. A training step must never wait on this.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use lockstep_core::Device;
use lockstep_core::data::mnist::{Mnist, Split};
use lockstep_core::data::{DataLoader, DataLoaderConfig};

pub const WORKERS: [usize; 4] = [0, 1, 2, 4];
const BATCH: usize = 128;
const EPOCHS: u64 = 3;

pub fn run(data: &Path, device: &Device) -> anyhow::Result<()> {
    let train = Arc::new(
        Mnist::load(data, Split::Train).with_context(|| format!("cannot read MNIST from {}", data.display()))?,
    );
    println!("MNIST train, batch {BATCH}, shuffled, {EPOCHS} epochs per setting, batches copied to {device}");
    println!("{:>8} {:>12} {:>14}", "workers", "batches/s", "samples/s");
    for workers in WORKERS {
        let config = DataLoaderConfig {
            batch_size: BATCH,
            num_workers: workers,
            ..Default::default()
        };
        let loader = DataLoader::simple(train.clone(), true, 0, config)?;
        let (mut batches, mut samples) = (0usize, 0usize);
        let start = Instant::now();
        for epoch in 0..EPOCHS {
            for batch in loader.iter(epoch) {
                let tensors = batch?.to_device(device)?;
                samples += tensors[0].dims()[0];
                batches += 1;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{workers:>8} {:>12.0} {:>14.0}",
            batches as f64 / seconds,
            samples as f64 / seconds
        );
    }
    Ok(())
}
