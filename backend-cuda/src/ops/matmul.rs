//! matmul through cuBLAS. A row-major product `C = A @ B` is the column-major `C^T = B^T A^T`,
//! so each operand is handed over as the transpose cuBLAS sees of it: a view whose rows (or
//! columns) are contiguous goes in place with the matching transpose flag; any other view is
//! packed first.

use std::sync::Arc;

use lockstep_core::backend::{BackendBuffer, BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result, Shape};

use crate::backend::CudaBackend;
use crate::blas::{Gemm, Operand};
use crate::buffer::CudaBuffer;
use crate::entry_points;

/// How cuBLAS reads a row-major `rows x cols` matrix with strides (rs, cs) as its transpose
/// (`cols x rows`, column-major): (transpose flag, leading dimension), or None if it cannot.
fn as_transposed(rs: usize, cs: usize, rows: usize, cols: usize) -> Option<(bool, usize)> {
    if (cs == 1 || cols == 1) && (rows == 1 || rs >= cols) {
        return Some((false, if rows == 1 { cols.max(1) } else { rs }));
    }
    if (rs == 1 || rows == 1) && (cols == 1 || cs >= rows) {
        return Some((true, if cols == 1 { rows.max(1) } else { cs }));
    }
    None
}

impl CudaBackend {
    pub(crate) fn gemm(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        const OP: &str = "matmul";
        let (a, b) = (self.operand(OP, lhs, Some(ll))?, self.operand(OP, rhs, Some(rl))?);
        let dtype = self.same_dtype(OP, a, b)?;
        // cuBLAS takes the dtypes the kernels compute with.
        entry_points::float_index(OP, dtype)?;
        let MatmulDims { batch, m, n, k } = dims;
        if ll.dims() != [batch, m, k] || rl.dims() != [batch, k, n] {
            return Err(Error::shape(
                OP,
                &ll.shape,
                &rl.shape,
                format!("expected [{batch}, {m}, {k}] @ [{batch}, {k}, {n}]"),
            ));
        }
        if batch * m * n == 0 || k == 0 {
            return self.fill(dtype, batch * m * n, 0.0);
        }
        // The right operand becomes cuBLAS's A (n x k), the left its B (k x m).
        let (rhs_op, _rhs_keep) = self.gemm_operand(b, rl, k, n)?;
        let (lhs_op, _lhs_keep) = self.gemm_operand(a, ll, m, k)?;
        let out = self.output(dtype, batch * m * n)?;
        let int =
            |x: usize| i32::try_from(x).map_err(|_| Error::invalid(OP, format!("{x} exceeds cuBLAS's 32-bit sizes")));
        let g = Gemm {
            m: int(n)?,
            n: int(m)?,
            k: int(k)?,
            batch: int(batch)?,
            a: rhs_op,
            b: lhs_op,
            c: out.ptr,
        };
        let name = match dtype {
            DType::BF16 => "cublas gemm bf16",
            DType::F16 => "cublas gemm f16",
            _ => "cublas gemm f32",
        };
        self.gpu
            .timed(name, || self.gpu.blas.gemm(&self.gpu.location, dtype, &g))?;
        self.gpu.blas_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// One `[batch, rows, cols]` operand as cuBLAS reads it, packed first when its view does not
    /// fit; the packed buffer (if any) is returned so it lives until the product is queued.
    fn gemm_operand(
        &self,
        buf: &CudaBuffer,
        layout: &Layout,
        rows: usize,
        cols: usize,
    ) -> Result<(Operand, Option<Arc<CudaBuffer>>)> {
        let size = buf.dtype().size_in_bytes();
        let batch_stride = |l: &Layout| if l.dims()[0] == 1 { 0 } else { l.strides[0] as i64 };
        let ld = |x: usize| {
            i32::try_from(x).map_err(|_| Error::invalid("matmul", "a stride exceeds cuBLAS's 32-bit leading dimension"))
        };
        if let Some((transpose, lead)) = as_transposed(layout.strides[1], layout.strides[2], rows, cols) {
            let op = Operand {
                ptr: buf.ptr + (layout.offset * size) as u64,
                transpose,
                ld: ld(lead)?,
                batch_stride: batch_stride(layout),
            };
            return Ok((op, None));
        }
        let packed_layout = Layout::contiguous(Shape::new(layout.dims().to_vec()));
        let packed = self.output(buf.dtype(), layout.elem_count())?;
        self.copy_into(buf, layout, &packed, &packed_layout)?;
        let op = Operand {
            ptr: packed.ptr,
            transpose: false,
            ld: ld(cols.max(1))?,
            batch_stride: batch_stride(&packed_layout),
        };
        Ok((op, Some(packed)))
    }
}

#[cfg(test)]
mod tests {
    use super::as_transposed;

    #[test]
    fn row_major_goes_untransposed_and_a_transpose_goes_transposed() {
        // [3, 4] contiguous: strides (4, 1).
        assert_eq!(as_transposed(4, 1, 3, 4), Some((false, 4)));
        // Its transpose viewed as [4, 3]: strides (1, 4).
        assert_eq!(as_transposed(1, 4, 4, 3), Some((true, 4)));
        // A row of a wider matrix keeps the wider leading dimension.
        assert_eq!(as_transposed(10, 1, 3, 4), Some((false, 10)));
    }

    #[test]
    fn broadcast_rows_and_scattered_views_are_packed() {
        // Every row the same (stride 0): cuBLAS cannot express it.
        assert_eq!(as_transposed(0, 1, 3, 4), None);
        // Both strides non-unit.
        assert_eq!(as_transposed(8, 2, 3, 4), None);
        // A single row or column takes any stride.
        assert_eq!(as_transposed(0, 1, 1, 4), Some((false, 4)));
        assert_eq!(as_transposed(5, 7, 3, 1), Some((false, 5)));
    }
}
