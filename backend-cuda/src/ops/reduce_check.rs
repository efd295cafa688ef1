//! The column reduction's start-up check: before its first use for a dtype, sums, maxima, minima
//! and argmaxes over the rows of a `[300, 70]` tensor (and all but argmax over the first two axes
//! of a `[3, 100, 70]` one, and over one chunk of 5 rows) run through `reduce_columns` and through the grouped
//! kernel. Every value is a multiple of 1/4 in [-2, 2), so the sums are exact in f32 in any
//! order and both kernels must agree bit for bit. A mismatch or a failed launch prints one line
//! and that dtype takes the grouped kernel from then on, as the fused attention does.

use lockstep_core::backend::ReduceKind;
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::CudaBackend;

impl CudaBackend {
    /// Whether the column reduction for `dtype` passed its check (run on first ask).
    pub(crate) fn column_reduce_passes_check(&self, dtype: DType) -> bool {
        let mut checks = self.column_reduce_checks.lock().unwrap_or_else(|p| p.into_inner());
        *checks.entry(dtype).or_insert_with(|| {
            let verdict = self.check_column_reduce(dtype);
            if let Err(why) = &verdict {
                eprintln!(
                    "warning: {}: the column reduction ({dtype}) failed its start-up check ({why}); \
                     the grouped kernel instead",
                    self.gpu.location
                );
            }
            verdict.is_ok()
        })
    }

    /// `Err` with the first disagreement, or the error that stopped a kernel.
    fn check_column_reduce(&self, dtype: DType) -> Result<()> {
        for (dims, axes) in [
            (vec![300, 70], vec![0]),
            (vec![3, 100, 70], vec![0, 1]),
            (vec![5, 64], vec![0]),
        ] {
            let n: usize = dims.iter().product();
            let raw: Vec<f64> = (0..n).map(|i| ((i * 7919 + 13) % 16) as f64 / 4.0 - 2.0).collect();
            let src = self.upload(&HostVec::from_f64(dtype, &raw))?;
            let layout = Layout::contiguous(dims.clone());
            // argmax reduces exactly one axis.
            for kind in ReduceKind::ALL
                .into_iter()
                .filter(|&k| k != ReduceKind::ArgMax || axes.len() == 1)
            {
                let r = self.reduction(kind, &src, &layout, &axes)?;
                let (columns, groups) = (self.reduce_by_columns(&r)?, self.reduce_by_groups(&r)?);
                if self.read_bits(&columns)? != self.read_bits(&groups)? {
                    return Err(lockstep_core::Error::invalid(
                        "reduce",
                        format!("{kind:?} over axes {axes:?} of {dims:?} differs from the grouped kernel's"),
                    ));
                }
            }
        }
        Ok(())
    }
}
