//! Modules: layers with named parameters and buffers whose names match PyTorch's, so a state
//! dict moves between Lockstep and PyTorch unchanged (`0.weight`, `1.running_mean`, …).

mod activation;
mod batchnorm;
mod conv;
mod dropout;
mod embedding;
mod flatten;
pub mod init;
mod linear;
mod module;
mod pool;
mod recurrent;
mod sequential;
mod spatial;
mod staged;
mod state_dict;

pub use activation::{Gelu, Relu};
pub use batchnorm::{BatchNorm, BatchNorm1d, BatchNorm2d};
pub use conv::{Conv2d, Conv2dConfig};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use linear::Linear;
pub use module::{AsAny, Module, ModuleExt, join_name};
pub use pool::{AvgPool2d, MaxPool2d};
pub use recurrent::{CellKind, Recurrent, RecurrentConfig, RecurrentLayer, RecurrentState, gru, lstm, rnn};
pub use sequential::Sequential;
pub use staged::{StagedModel, layer_times, sizes_by_cost, sizes_by_parameters};
