//! Lockstep core: tensors, autograd, layers, optimizers, data loading and a trainer, with the
//! CPU reference backend. Devices are chosen at run time by name: `cpu:0` always, `wgpu:0` and
//! `cuda:0` once `lockstep_wgpu::register()` or `lockstep_cuda::register()` ran.
//!
//! # What to import
//!
//! There is no prelude. The crate root holds what every program names — [`Tensor`], [`Device`],
//! [`DType`], [`Generator`], [`Result`] and [`Error`], [`no_grad`] — and each part of a
//! training program is one module:
//!
//! - [`nn`]: layers, [`nn::Module`] and [`nn::ModuleExt`] (parameters, train/eval, device
//!   moves, `save`/`load` of PyTorch-named weights) and `#[derive(Module)]` for models of your own;
//! - [`optim`]: SGD and Adam(W), learning-rate schedules, gradient clipping;
//! - [`data`]: datasets (in memory, MNIST, CIFAR-10, image folders, text) and the `DataLoader`;
//! - [`train`]: the `Trainer` and its `TrainingSetup`, tasks, callbacks, listeners, precision and
//!   devices; [`train::checkpoint`] reads and writes safetensors files;
//! - [`models`]: the built-in MLP, LeNet-5, ResNets, GPT and seq2seq;
//! - [`distributed`]: what data-parallel training can be told (the gradient reducer's
//!   settings, replica checks, rendezvous of processes, load balancing).
//!
//! [`backend`] and [`conformance`] are for those who add a device: the operations a backend
//! implements, and the suite it must pass against the CPU reference.
//!
//! # Quick start
//!
//! A model is its fields and its forward; `TrainingSetup` and the `Trainer` do the rest, as
//! PyTorch Lightning's `LightningModule` and `Trainer` do:
//!
//! ```
//! use std::sync::Arc;
//!
//! use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
//! use lockstep_core::nn::{Linear, Module, ModuleExt, Relu};
//! use lockstep_core::optim::{Adam, AdamConfig};
//! use lockstep_core::train::{Trainer, TrainerConfig, TrainingSetup};
//! use lockstep_core::{Device, Generator, HostVec, Result, Tensor};
//!
//! #[derive(Module)]
//! struct Classifier {
//!     hidden: Linear,
//!     act: Relu,
//!     out: Linear,
//! }
//!
//! impl Classifier {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         self.out.forward(&self.act.forward(&self.hidden.forward(x)?)?)
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! // 256 points in the plane, labelled by the sign of x + y.
//! let xy: Vec<f32> = (0..512).map(|i| lockstep_core::rng::uniform_at(1, i, 0) as f32 - 0.5).collect();
//! let labels: Vec<u32> = xy.chunks(2).map(|p| u32::from(p[0] + p[1] > 0.0)).collect();
//! let points = TensorDataset::new(vec![
//!     HostTensor::new(HostVec::F32(xy), [256, 2])?,
//!     HostTensor::new(HostVec::U32(labels), [256])?,
//! ])?;
//! let config = DataLoaderConfig { batch_size: 32, ..Default::default() };
//! let train = DataLoader::simple(Arc::new(points), true, 0, config)?;
//!
//! let (device, init) = (Device::cpu(), Generator::new(0));
//! let model = Classifier {
//!     hidden: Linear::new(2, 16, true, &device, &init)?,
//!     act: Relu,
//!     out: Linear::new(16, 2, true, &device, &init)?,
//! };
//! let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2))?;
//! let mut setup = TrainingSetup::new(model, optimizer);
//! let mut trainer = Trainer::new(TrainerConfig { max_epochs: 5, ..Default::default() })?;
//! let report = trainer.fit(&mut setup, &train, None)?;
//! assert_eq!(report.steps, 5 * 8);
//! // It learned: an untrained classifier of two classes starts near ln 2 ≈ 0.69.
//! assert!(report.last_train_loss.unwrap() < 0.5);
//! # Ok(())
//! # }
//! ```
//!
//! From there: `Trainer::devices(devices, build)` trains one replica per device, `model.save`
//! and `model.load` move weights to and from PyTorch, and `core/examples/` holds whole programs
//! (a hand-written loop, callbacks, tasks, PyTorch weights, data parallel).

#![warn(missing_docs)]

// `#[derive(Module)]` writes paths from `::lockstep_core`; inside this crate they name itself.
extern crate self as lockstep_core;

pub mod autocast;
pub mod autograd;
pub mod backend;
pub mod conformance;
pub mod data;
pub mod device;
pub mod distributed;
pub mod dtype;
pub mod error;
pub mod limits;
pub mod models;
pub mod nn;
pub mod optim;
pub mod rng;
pub mod shape;
pub mod tensor;
pub mod train;

/// What the code `#[derive(Module)]` writes calls (`::lockstep_core::__private::…`): no API of
/// its own, and free to change with the derive.
#[doc(hidden)]
pub mod __private {
    pub use crate::nn::child::Child;
    pub use crate::nn::layer_error::name_failing_layer;
    pub use crate::nn::module::{describe_tree, remap};
}

pub use autograd::{NoGradGuard, no_grad};
pub use device::Device;
pub use dtype::{DType, Element, HostVec};
pub use error::{Error, Result};
pub use rng::Generator;
pub use shape::{Layout, Shape};
pub use tensor::{Conv2dOptions, Pool2dOptions, Tensor};
