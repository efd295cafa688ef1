//! The Backend operations, one file per shader family (`layout.rs` drives fill.wgsl,
//! copy_strided.wgsl, cast.wgsl and rand.wgsl; the others share their shader's name; `bf16.rs`
//! runs any of them on bf16 tensors).

mod batch_norm;
mod bf16;
mod bias_act;
mod conv;
mod elementwise;
mod index;
mod layer_norm;
mod layout;
mod matmul;
mod optim;
mod reduce;
mod softmax;

use lockstep_core::Result;
use lockstep_core::shape::Layout;

use crate::backend::{to_u32, view_params};

/// Parameters of an elementwise dispatch over one shape: [n, rank, dims..., then each operand's
/// view [offset, strides...]] (the layout `strided_index` in common.wgsl reads).
fn strided_params(op: &'static str, layouts: &[&Layout]) -> Result<Vec<u32>> {
    let shape = &layouts[0].shape;
    let mut p = vec![to_u32(op, shape.elem_count())?, to_u32(op, shape.rank())?];
    for &d in shape.dims() {
        p.push(to_u32(op, d)?);
    }
    for layout in layouts {
        p.extend(view_params(op, layout)?);
    }
    Ok(p)
}

/// The position of an op in its enum's `ALL` list: the `OP` constant the shaders switch on.
fn op_index<T>(all: &[T], name: impl Fn(&T) -> &'static str, wanted: &'static str) -> f64 {
    all.iter().position(|o| name(o) == wanted).expect("every op is in ALL") as f64
}
