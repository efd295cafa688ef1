//! Modules: layers with named parameters and buffers whose names match PyTorch's, so a state
//! dict moves between Lockstep and PyTorch unchanged (`0.weight`, `1.running_mean`, …).
//!
//! A model of your own is its fields and its forward; `#[derive(Module)]` writes the rest
//! (parameters by field name, train/eval, device moves, printing):
//!
//! ```
//! use lockstep_core::nn::{Linear, Module, ModuleExt, Relu};
//! use lockstep_core::{Device, Generator, Result, Tensor};
//!
//! #[derive(Module)]
//! struct Mlp {
//!     fc1: Linear,
//!     act: Relu,
//!     fc2: Linear,
//! }
//!
//! impl Mlp {
//!     fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         self.fc2.forward(&self.act.forward(&self.fc1.forward(x)?)?)
//!     }
//! }
//!
//! let (device, g) = (Device::cpu(), Generator::new(0));
//! let mlp = Mlp {
//!     fc1: Linear::new(4, 8, true, &device, &g)?,
//!     act: Relu,
//!     fc2: Linear::new(8, 2, true, &device, &g)?,
//! };
//! let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
//! # Ok::<(), lockstep_core::Error>(())
//! ```
//!
//! Without its own `forward` the same struct does not compile:
//!
//! ```compile_fail
//! use lockstep_core::nn::{Linear, Module};
//!
//! #[derive(Module)]
//! struct Mlp {
//!     fc1: Linear,
//! }
//! ```

mod activation;
mod attention;
mod batchnorm;
pub mod checkpoint;
pub(crate) mod child;
mod conv;
mod dropout;
mod embedding;
mod flatten;
pub mod init;
pub(crate) mod layer_error;
mod layer_norm;
mod linear;
pub(crate) mod module;
mod pool;
mod recurrent;
mod sequential;
mod spatial;
mod staged;
mod state_dict;
mod tie;
mod weights;

pub use activation::{Gelu, GeluApproximate, Relu};
pub use attention::CausalSelfAttention;
pub use batchnorm::{BatchNorm, BatchNorm1d, BatchNorm2d};
pub use checkpoint::{Checkpointed, checkpoint, checkpoint_inputs};
pub use conv::{Conv2d, Conv2dConfig};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
/// `#[derive(Module)]`: see the `lockstep-derive` crate for the field rules.
pub use lockstep_derive::Module;
pub use module::{AsAny, Module, ModuleExt};
pub(crate) use module::{describe_tree, remap};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use recurrent::{CellKind, Recurrent, RecurrentConfig, RecurrentLayer, RecurrentState, gru, lstm, rnn};
pub use sequential::Sequential;
pub use staged::{StagedModel, layer_times, sizes_by_cost, sizes_by_parameters};
pub use tie::TiedWeight;
pub use weights::{LoadReport, load_weights};
