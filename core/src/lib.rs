//! Lockstep core: tensors, autograd, modules, optimizers, collectives and the CPU reference
//! backend. Nothing here knows about a particular GPU API: devices plug in through
//! `backend::Backend` and are chosen at run time by name.

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
pub mod models;
pub mod nn;
pub mod optim;
pub mod rng;
pub mod shape;
pub mod tensor;
pub mod train;

pub use autograd::{NoGradGuard, no_grad};
pub use device::Device;
pub use dtype::{DType, Element, HostVec};
pub use error::{Error, Result};
pub use rng::Generator;
pub use shape::{Layout, Shape};
pub use tensor::{Conv2dOptions, Pool2dOptions, Tensor};
