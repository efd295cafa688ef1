//! matmul (matmul.wgsl): batched, any strides, tiled through workgroup memory, on a grid of output
//! blocks that folds into y beyond 65535 workgroups; bf16 read and written in its packed words.

use lockstep_core::backend::{BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// Output rows and columns per workgroup of the tiled kernel (`TILE` in matmul.wgsl).
const TILE: usize = 64;
/// The naive kernel's workgroup edge.
const NAIVE_EDGE: usize = 16;

impl WgpuBackend {
    pub(crate) fn gemm(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        // bf16 operands are read from their packed words, and the product written two columns
        // a word where no pair straddles two rows (n even); else f32 copies, rounded after.
        if lhs.dtype() == DType::BF16 && rhs.dtype() == DType::BF16 && dims.n.is_multiple_of(2) {
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
        let edge = if entry == "matmul" { TILE } else { NAIVE_EDGE };
        // One workgroup per output block, numbered through the batch (folded into y as needed).
        let groups = self.groups(OP, batch * m.div_ceil(edge) * n.div_ceil(edge))?;
        self.launch(
            &Variant::new(OP, entry, &[t]),
            &params,
            &[(1, a), (2, b), (3, &out)],
            groups,
        )?;
        Ok(out)
    }
}
