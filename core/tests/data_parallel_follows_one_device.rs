//! A data-parallel run follows the one-device run: a conv net with dropout and SyncBatchNorm
//! trained on 2 and 4 CPU replicas (`DataParallel::on_threads`) logs the one-device run's
//! losses and ends at its weights, to summation order, over 100 SGD steps. Dropout masks are
//! keyed to a sample's place in the global batch (one dropout's samples start inside a Philox
//! block on some replicas, the other's never do), and the replicas are built from other seeds
//! than rank 0's, whose weights and streams they adopt. The same holds for the one-device
//! program given `Trainer::devices`.

use std::sync::Arc;

use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, HostTensor, RandomSampler, Sample};
use lockstep_core::nn::{BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Flatten, Linear, ModuleExt, Relu, Sequential};
use lockstep_core::optim::{Sgd, SgdConfig};
use lockstep_core::rng::uniform_at;
use lockstep_core::train::{ChannelListener, DataParallel, Event, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, HostVec, Result};

const LEN: usize = 64;
const BATCH: usize = 16;
const STEPS: u64 = 100;
const SHUFFLE_SEED: u64 = 4;
const TOLERANCE: f64 = 1e-4;

/// 1×5×5 images, labelled by which third of the image is brightest.
struct Images;

impl Dataset for Images {
    fn len(&self) -> usize {
        LEN
    }
    fn get(&self, i: usize) -> Result<Sample> {
        let x: Vec<f32> = (0..25).map(|j| uniform_at(2, i as u64, j) as f32 - 0.5).collect();
        let third = |k: usize| x[k * 8..k * 8 + 8].iter().sum::<f32>();
        let label = (0..3).max_by(|&a, &b| third(a).total_cmp(&third(b))).unwrap_or(0) as u32;
        Ok(vec![
            HostTensor::new(HostVec::F32(x), [1, 5, 5])?,
            HostTensor::new(HostVec::U32(vec![label]), [])?,
        ])
    }
}

/// Conv (3 channels of 5×5: 75 values a sample, so a replica's dropout may start inside a
/// Philox block), batch norm, dropout, then a hidden layer with dropout (16 a sample).
fn setup(device: &Device, seed: u64) -> Result<TrainingSetup> {
    let init = Generator::new(seed);
    let drops = Arc::new(Generator::new(seed + 1));
    let model = Sequential::new()
        .add(Conv2d::new(Conv2dConfig::new(1, 3, 3).padding(1), device, &init)?)
        .add(BatchNorm2d::new(3, device)?)
        .add(Relu)
        .add(Dropout::new(0.2, drops.clone())?)
        .add(Flatten::new())
        .add(Linear::new(75, 16, true, device, &init)?)
        .add(Relu)
        .add(Dropout::new(0.3, drops)?)
        .add(Linear::new(16, 3, true, device, &init)?);
    let optimizer = Sgd::new(model.parameters(), SgdConfig::new(0.1).momentum(0.9))?;
    Ok(TrainingSetup::new(model, optimizer))
}

fn config() -> TrainerConfig {
    TrainerConfig {
        max_epochs: 1000,
        max_steps: Some(STEPS),
        log_every_n_steps: 1,
        ..Default::default()
    }
}

fn losses(events: std::sync::mpsc::Receiver<lockstep_core::train::Record>) -> Vec<f64> {
    events
        .try_iter()
        .filter_map(|r| match r.event {
            Event::Step { loss, .. } => Some(loss),
            _ => None,
        })
        .collect()
}

/// Every weight and buffer, by name.
fn state(setup: &TrainingSetup) -> Vec<(String, Vec<f32>)> {
    let model = setup.model.as_ref();
    model
        .named_parameters()
        .into_iter()
        .chain(model.named_buffers())
        .filter(|(name, _)| !name.ends_with("num_batches_tracked"))
        .map(|(name, t)| (name, t.to_vec::<f32>().unwrap()))
        .collect()
}

/// The one-device program: the global batch, shuffled as the replicas' loaders are; with
/// `devices`, the same program plus `Trainer::devices` (and SyncBatchNorm).
fn program(devices: Option<Vec<Device>>) -> Result<Run> {
    let device = Device::cpu();
    let mut s = setup(&device, 1)?;
    let sampler = Arc::new(RandomSampler {
        len: LEN,
        seed: SHUFFLE_SEED,
    });
    let loader_config = DataLoaderConfig {
        batch_size: BATCH,
        ..Default::default()
    };
    let loader = DataLoader::new(Arc::new(Images), sampler, loader_config)?;
    let mut trainer = Trainer::new(config())?;
    if let Some(devices) = devices {
        // Other seeds than rank 0's, as above: the replicas adopt rank 0's.
        trainer = trainer
            .devices(devices, |device| setup(device, 1 + 10 * ordinal(device)))
            .sync_batchnorm(true);
    }
    let (listener, events) = ChannelListener::new(1 << 12);
    trainer.add_listener(listener);
    trainer.fit(&mut s, &loader, None)?;
    drop(trainer);
    Ok((state(&s), losses(events)))
}

/// N of `cpu:N`.
fn ordinal(device: &Device) -> u64 {
    device
        .location()
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A run's weights and buffers by name, and its logged losses.
type Run = (Vec<(String, Vec<f32>)>, Vec<f64>);

fn one_device() -> Run {
    program(None).unwrap()
}

fn cpus(world: usize) -> Vec<Device> {
    (0..world)
        .map(|i| Device::parse(&format!("cpu:{i}")).unwrap())
        .collect()
}

fn on_replicas(world: usize) -> Run {
    let devices = cpus(world);
    let (listener, events) = ChannelListener::new(1 << 12);
    let trained = DataParallel::on_threads(devices)
        .config(config())
        .batch_size(BATCH)
        .shuffle(true, SHUFFLE_SEED)
        .sync_batchnorm(true)
        .leader(move |trainer| {
            trainer.add_listener(listener);
            Ok(())
        })
        // Seeds other than rank 0's: a replica adopts rank 0's weights and random streams.
        .fit(Arc::new(Images), None, |replica| {
            setup(&replica.device, 1 + 10 * replica.rank as u64)
        })
        .unwrap();
    (state(&trained.setup), losses(events))
}

/// The largest difference, relative to the reference's largest magnitude (per tensor).
fn relative_difference(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(1e-6f64, |m, &v| m.max(f64::from(v).abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs() / scale)
        .fold(0.0, f64::max)
}

#[test]
fn a_conv_net_with_dropout_and_sync_batchnorm_on_2_and_4_replicas_follows_one_device() {
    follows_one_device(on_replicas);
}

#[test]
fn the_one_device_program_with_trainer_devices_follows_one_device() {
    follows_one_device(|world| program(Some(cpus(world))).unwrap());
}

#[test]
fn trainer_devices_refuses_a_setup_off_its_first_device_and_an_uneven_batch() {
    let off = program(Some(vec![Device::parse("cpu:1").unwrap(), Device::cpu()]))
        .err()
        .unwrap()
        .to_string();
    assert!(
        off.contains("the setup given to fit is on cpu:0, not on the first of the devices (cpu:1)"),
        "{off}"
    );
    let uneven = program(Some(cpus(3))).err().unwrap().to_string();
    assert!(
        uneven.contains("batch of 16 (the global batch) must split evenly over 3 devices"),
        "{uneven}"
    );
}

/// `run(world)`'s losses and weights against the one-device run's, for 2 and 4 replicas.
fn follows_one_device(run: impl Fn(usize) -> Run) {
    let (weights, losses) = one_device();
    assert_eq!(losses.len(), STEPS as usize);
    for world in [2, 4] {
        let (replica_weights, replica_losses) = run(world);
        assert_eq!(replica_losses.len(), losses.len(), "{world} replicas: logged steps");
        for (step, (got, want)) in replica_losses.iter().zip(&losses).enumerate() {
            let difference = (got - want).abs() / want.abs();
            assert!(
                difference < TOLERANCE,
                "{world} replicas, step {}: loss {got} against one device's {want} ({difference:.1e} relative)",
                step + 1
            );
        }
        for ((name, got), (_, want)) in replica_weights.iter().zip(&weights) {
            let difference = relative_difference(got, want);
            assert!(
                difference < TOLERANCE,
                "{world} replicas: {name} is {difference:.1e} (relative) from one device's after {STEPS} steps"
            );
        }
    }
}
