//! matmul (matmul.wgsl): batched, any strides, tiled through workgroup memory, on a grid of output
//! blocks that folds into y beyond 65535 workgroups; k split across workgroups where the output
//! has too few blocks to keep a GPU busy; bf16 read and written in its packed words.

use lockstep_core::backend::{BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// Output rows and columns per workgroup of the tiled kernel (`TILE` in matmul.wgsl).
const TILE: usize = 64;
/// The naive kernel's workgroup edge.
const NAIVE_EDGE: usize = 16;
/// The k step of the tiled kernel (`TILE_K`): split chunks are multiples of it.
const TILE_K: usize = 16;
/// Workgroups a split product aims for: a few per compute unit of a large GPU (an H200 has 132).
const SPLIT_TARGET_WORKGROUPS: usize = 512;
/// The least of k a split sums, so its partial products cost little beside its arithmetic.
const MIN_SPLIT_K: usize = 1024;

/// The chunk of k each workgroup sums where the output has too few `TILE` blocks to fill a GPU
/// and k is long enough to share out (a convolution's weight gradient: 64 x 27 outputs summed over
/// half a million pixels would otherwise run on one workgroup); None where one pass pays.
/// It depends on the shape alone, so a product sums in the same order on every device.
fn split_k_chunk(dims: MatmulDims) -> Option<usize> {
    let blocks = dims.batch * dims.m.div_ceil(TILE) * dims.n.div_ceil(TILE);
    let splits = SPLIT_TARGET_WORKGROUPS
        .div_ceil(blocks.max(1))
        .min(dims.k / MIN_SPLIT_K);
    (splits >= 2).then(|| dims.k.div_ceil(splits).next_multiple_of(TILE_K))
}

impl WgpuBackend {
    pub(crate) fn gemm(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        // bf16 operands are read from their packed words, and the product written two elements
        // a word where no pair straddles two rows of a block (n even, or a split product, whose
        // sums are written in flat order); else f32 copies, rounded after.
        if let Some(out) = self.gemm_cooperative(lhs, ll, rhs, rl, dims, split_k_chunk(dims).is_none())? {
            return Ok(out);
        }
        let packed = dims.n.is_multiple_of(2) || split_k_chunk(dims).is_some();
        if lhs.dtype() == DType::BF16 && rhs.dtype() == DType::BF16 && packed {
            return self.gemm_with("matmul", lhs, ll, rhs, rl, dims);
        }
        self.in_f32("matmul", [lhs, rhs], |[lhs, rhs]| {
            self.gemm_with("matmul", lhs, ll, rhs, rl, dims)
        })
    }

    /// The same product with the untiled kernel: the baseline the benchmark compares against.
    pub fn matmul_naive(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        self.in_f32("matmul", [lhs, rhs], |[lhs, rhs]| {
            self.gemm_with("matmul_naive", lhs, ll, rhs, rl, dims)
        })
    }

    fn gemm_with(
        &self,
        entry: &'static str,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        const OP: &str = "matmul";
        let MatmulDims { batch, m, n, k } = dims;
        if ll.dims() != [batch, m, k] || rl.dims() != [batch, k, n] {
            return Err(Error::invalid(
                OP,
                format!("layouts {:?} and {:?} do not match {dims:?}", ll.dims(), rl.dims()),
            ));
        }
        let a = self.operand(OP, lhs, Some(ll))?;
        let b = self.operand(OP, rhs, Some(rl))?;
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        let t = self.element_type(OP, a.dtype())?;
        let out = self.alloc(a.dtype(), batch * m * n)?;
        if batch * m * n == 0 {
            return Ok(out);
        }
        let mut params = vec![to_u32(OP, m)?, to_u32(OP, n)?, to_u32(OP, k)?];
        for layout in [ll, rl] {
            params.push(to_u32(OP, layout.offset)?);
            for &s in &layout.strides {
                params.push(to_u32(OP, s)?);
            }
        }
        params.push(to_u32(OP, batch)?);
        let split = if entry == "matmul" { split_k_chunk(dims) } else { None };
        params.push(to_u32(OP, split.unwrap_or(k))?);
        let edge = if entry == "matmul" { TILE } else { NAIVE_EDGE };
        // One workgroup per output block, numbered through the batch (folded into y as needed).
        let blocks = batch * m.div_ceil(edge) * n.div_ceil(edge);
        let Some(chunk) = split else {
            self.launch(
                &Variant::new(OP, entry, &[t]),
                &params,
                &[(1, a), (2, b), (3, &out)],
                self.groups(OP, blocks)?,
            )?;
            return Ok(out);
        };
        // Each split's blocks write their f32 partial products, which one more pass adds up.
        let splits = k.div_ceil(chunk);
        let outputs = batch * m * n;
        let partials = self.alloc(DType::F32, splits * outputs)?;
        self.launch(
            &Variant::new(OP, "matmul_split", &[t]),
            &params,
            &[(1, a), (2, b), (4, &partials)],
            self.groups(OP, splits * blocks)?,
        )?;
        self.launch(
            &Variant::new(OP, "matmul_split_sum", &[t]),
            &[to_u32(OP, outputs)?, to_u32(OP, splits)?],
            &[(3, &out), (4, &partials)],
            self.word_grid(OP, a.dtype(), outputs)?,
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: usize, m: usize, n: usize, k: usize) -> MatmulDims {
        MatmulDims { batch, m, n, k }
    }

    #[test]
    fn splits_k_where_the_output_has_few_blocks_and_k_is_long() {
        // ResNet-18's conv1 weight gradient at batch 512: one block, 512 chunks of 1024.
        assert_eq!(split_k_chunk(dims(1, 64, 27, 524_288)), Some(1024));
        // layer1's: 9 blocks, 57 splits of k rounded up to a multiple of TILE_K.
        let chunk = split_k_chunk(dims(1, 64, 576, 524_288)).unwrap();
        assert_eq!((chunk % TILE_K, 524_288usize.div_ceil(chunk)), (0, 57));
        // Enough blocks already, or too short a k to share out: one pass.
        assert_eq!(split_k_chunk(dims(1, 512, 4608, 8192)), None);
        assert_eq!(split_k_chunk(dims(8, 64, 64, 8192)).map(|c| 8192 / c), Some(8));
        assert_eq!(split_k_chunk(dims(1, 64, 64, 2047)), None);
    }
}
