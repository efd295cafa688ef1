//! The Backend operations, one file per shader family (`layout.rs` drives fill.wgsl,
//! copy_strided.wgsl, cast.wgsl and rand.wgsl; the others share their shader's name; `bf16.rs`
//! runs any of them on bf16 tensors).

mod attention;
mod batch_norm;
mod bf16;
mod bias_act;
mod conv;
mod conv_gemm;
mod cross_entropy;
mod elementwise;
mod index;
mod layer_norm;
mod layout;
pub(crate) mod matmul;
mod matmul_coop;
mod multi_tensor;
mod optim;
mod reduce;
mod softmax;

pub(crate) use attention::{attention_plan, fused_by_default as attention_fused_by_default};
use lockstep_core::Result;
use lockstep_core::shape::{Layout, MergedDims};
pub(crate) use multi_tensor::{by_default as multi_tensor_by_default, plan as multi_tensor_plan};

use crate::backend::to_u32;

/// Parameters of an elementwise dispatch over one shape: [n, rank, dims..., then each operand's
/// view [offset, strides...]] (the layout `strided_index` in common.wgsl reads), over the
/// operands' merged dimensions: a contiguous operand is one, indexed without a division.
fn strided_params(op: &'static str, layouts: &[&Layout]) -> Result<Vec<u32>> {
    let merged = MergedDims::new(layouts);
    let mut p = vec![to_u32(op, layouts[0].elem_count())?, to_u32(op, merged.dims.len())?];
    for &d in &merged.dims {
        p.push(to_u32(op, d)?);
    }
    for (layout, strides) in layouts.iter().zip(&merged.strides) {
        p.push(to_u32(op, layout.offset)?);
        for &s in strides {
            p.push(to_u32(op, s)?);
        }
    }
    Ok(p)
}

/// The position of an op in its enum's `ALL` list: the `OP` constant the shaders switch on.
fn op_index<T>(all: &[T], name: impl Fn(&T) -> &'static str, wanted: &'static str) -> f64 {
    all.iter().position(|o| name(o) == wanted).expect("every op is in ALL") as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_core::Shape;

    #[test]
    fn contiguous_operands_reach_the_shaders_as_one_dimension() {
        let x = Layout::contiguous([64, 64, 32, 32]);
        let n = 64 * 64 * 32 * 32;
        // [n, rank, dims.., then each view: offset, strides..]
        assert_eq!(strided_params("t", &[&x, &x]).unwrap(), vec![n, 1, n, 0, 1, 0, 1]);
        // A per-channel bias keeps the axes it repeats over: [batch, channels, pixels].
        let bias = Layout::contiguous([1, 64, 1, 1])
            .broadcast_to("t", &Shape::new([64, 64, 32, 32]))
            .unwrap();
        let p = strided_params("t", &[&x, &bias]).unwrap();
        assert_eq!(&p[..5], &[n, 3, 64, 64, 1024]);
        assert_eq!(&p[5..], &[0, 65536, 1024, 1, 0, 0, 1, 0]);
    }
}
