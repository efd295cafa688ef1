//! `lockstep bench resnet`: full training steps of torchvision's ResNet-18 with the CIFAR stem
//! (zero_grad, forward, cross-entropy, backward, SGD with momentum and weight decay on weights)
//! on a fixed batch of 32x32 images, in each precision asked for; and the loader's augmented
//! CIFAR-shaped images per second with 0, 2 and 4 workers, which must outrun the steps.

use std::sync::Arc;
use std::time::Instant;

use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::cifar::{self, Kind};
use lockstep_core::data::{DataLoader, DataLoaderConfig, ImageClassification, ImageSource};
use lockstep_core::models::{ResNetConfig, Stem, resnet};
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::optim::{DecayScope, Sgd, SgdConfig};
use lockstep_core::{DType, Device, Generator, Tensor};
use serde::Serialize;

use super::steps::{self, StepResult, Steps};
use super::timing::Timing;

/// Worker counts of the loader measurement.
pub const WORKERS: [usize; 3] = [0, 2, 4];

#[derive(Clone, Debug, Serialize)]
pub struct ResnetPlan {
    pub model: String,
    pub batch: usize,
    pub image: usize,
    pub classes: usize,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    /// `32`, `16-mixed` or `bf16-mixed`, each measured in turn.
    pub precisions: Vec<String>,
    /// One repetition is one training step ended by a host sync (reading the loss).
    pub timing: Timing,
    /// Kernels to list from one more step timed kernel by kernel (`--kernels`; ours alone).
    #[serde(skip)]
    pub kernel_profile: usize,
}

impl Default for ResnetPlan {
    fn default() -> Self {
        ResnetPlan {
            model: "resnet18".into(),
            batch: 64,
            image: 32,
            classes: 10,
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 5e-4,
            precisions: vec!["32".into(), "bf16-mixed".into()],
            timing: steps::MODEL_TIMING,
            kernel_profile: 0,
        }
    }
}

pub fn run(device: &Device, plan: &ResnetPlan) -> anyhow::Result<Vec<StepResult>> {
    let generator = Generator::new(0);
    let config = ResNetConfig::named(&plan.model)
        .ok_or_else(|| anyhow::anyhow!("bench resnet knows resnet18, resnet34 and resnet50, not {}", plan.model))?
        .stem(Stem::Cifar)
        .classes(plan.classes);
    let model = resnet(config, device, &generator)?;
    let sgd = SgdConfig::new(plan.lr)
        .momentum(plan.momentum)
        .weight_decay(plan.weight_decay)
        .decay_scope(DecayScope::Weights);
    let mut opt = Sgd::new(model.parameters(), sgd)?;
    let x = Tensor::rand_normal(
        [plan.batch, 3, plan.image, plan.image],
        0.0,
        1.0,
        DType::F32,
        &generator,
        device,
    )?;
    let labels: Vec<u32> = (0..plan.batch)
        .map(|_| generator.next_below(plan.classes as u64) as u32)
        .collect();
    let y = Tensor::from_vec(labels, [plan.batch], device)?;
    let steps = Steps {
        loss: Box::new(|| model.forward(&x)?.cross_entropy(&y)),
        optimizer: &mut opt,
        clip: None,
        batch: plan.batch,
        items_per_step: plan.batch,
        kernel_profile: plan.kernel_profile,
    };
    steps::measure(device, &plan.timing, &plan.precisions, steps)
}

/// CIFAR-shaped images of random bytes held in memory: the loader's work without a disk.
struct RandomImages(Vec<u8>);

impl ImageSource for RandomImages {
    fn len(&self) -> usize {
        self.0.len() / cifar::PIXELS
    }
    fn shape(&self) -> [usize; 3] {
        [3, 32, 32]
    }
    fn classes(&self) -> usize {
        10
    }
    fn read(&self, index: usize, out: &mut [u8]) -> lockstep_core::Result<u32> {
        out.copy_from_slice(&self.0[index * cifar::PIXELS..(index + 1) * cifar::PIXELS]);
        Ok((index % 10) as u32)
    }
}

/// Augmented (crop, flip, normalise) images per second delivered by the loader, per worker count.
pub fn loader_images_per_s(batch: usize) -> anyhow::Result<Vec<(usize, f64)>> {
    let images = 4096;
    let bytes = (0..images * cifar::PIXELS)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (mean, std) = Kind::Cifar10.mean_std();
    let source = Arc::new(RandomImages(bytes));
    let data = Arc::new(ImageClassification::new(
        source,
        Augment::CIFAR,
        Normalize::new(&mean, &std),
        0,
    )?);
    WORKERS
        .iter()
        .map(|&workers| {
            let config = DataLoaderConfig {
                batch_size: batch,
                num_workers: workers,
                ..Default::default()
            };
            let loader = DataLoader::simple(data.clone(), true, 0, config)?;
            let start = Instant::now();
            let mut delivered = 0;
            for epoch in 0..2 {
                for b in loader.iter(epoch) {
                    delivered += b?.len();
                }
            }
            Ok((workers, delivered as f64 / start.elapsed().as_secs_f64()))
        })
        .collect()
}
