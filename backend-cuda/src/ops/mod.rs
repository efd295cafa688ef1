//! The Backend operations, one file per kernel file of lockstep-kernels (`transfer.rs` drives
//! fill.cu and rand.cu and the copies to and from the host; `matmul.rs` calls cuBLAS,
//! `conv_dnn.rs` cuDNN).

mod attention;
pub(crate) use attention::attention_plan;
mod attention_check;
mod batch_norm;
mod conv;
mod conv_dnn;
mod cross_entropy;
mod elementwise;
mod index;
mod layer_norm;
mod layout;
mod matmul;
mod multi_tensor;
mod multi_tensor_check;
mod optim;
mod reduce;
mod reduce_check;
mod softmax;
mod transfer;

/// The position of an op in its enum's `ALL` list: the number the kernels switch on.
fn op_index<T>(all: &[T], name: impl Fn(&T) -> &'static str, wanted: &'static str) -> u32 {
    all.iter().position(|o| name(o) == wanted).unwrap_or(usize::MAX) as u32
}
