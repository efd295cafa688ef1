//! The multi-tensor kernels' start-up check: before their first use for a dtype, one small case
//! (tensors of 0, 1, 300 and `CHUNK_LEN + 5` elements: an empty table entry, a partial block
//! and two chunks of one tensor) runs through them and through the per-tensor kernels. The
//! updates, the scaled copies and the cast copies must equal the per-tensor results bit for bit,
//! the sum of squares the host's f64 sum within f32 rounding, the count of inf and NaN elements
//! the four planted. A mismatch or a failed launch prints one line and that dtype takes the
//! per-tensor loop from then on, as the fused attention does.

use lockstep_core::backend::{AdamOperands, AdamStep, BinaryOp, BufferRef, SgdOperands, SgdStep};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use super::multi_tensor::CHUNK_LEN;
use crate::backend::CudaBackend;

/// The lengths of the check's tensors.
const LENS: [usize; 4] = [0, 1, 300, CHUNK_LEN as usize + 5];

impl CudaBackend {
    /// Whether the multi-tensor kernels for `dtype` passed their check (run on first ask).
    pub(crate) fn multi_tensor_passes_check(&self, dtype: DType) -> bool {
        let mut checks = self.multi_tensor_checks.lock().unwrap_or_else(|p| p.into_inner());
        *checks.entry(dtype).or_insert_with(|| {
            let verdict = self.check_multi_tensor(dtype);
            if let Err(why) = &verdict {
                eprintln!(
                    "warning: {}: the multi-tensor optimizer and clipping kernels ({dtype}) failed their start-up \
                     check ({why}); one launch per tensor instead",
                    self.gpu.location
                );
            }
            verdict.is_ok()
        })
    }

    /// `Err` with the first disagreement, or the error that stopped a kernel.
    fn check_multi_tensor(&self, dtype: DType) -> Result<()> {
        self.check_adam(dtype)?;
        self.check_sgd(dtype)?;
        self.check_sum_of_squares(dtype)?;
        self.check_non_finite_count(dtype)?;
        self.check_scaled_copies(dtype)?;
        self.check_cast_copies(dtype)
    }

    /// Tensor `k`'s values in [-2, 2), rounded to `dtype`, on the device.
    fn check_values(&self, dtype: DType, k: usize, salt: usize) -> Result<Vec<BufferRef>> {
        LENS.iter()
            .map(|&n| {
                let raw: Vec<f64> = (0..n)
                    .map(|i| ((i * 7919 + k * 131 + salt) % 1031) as f64 / 257.75 - 2.0)
                    .collect();
                self.upload(&HostVec::from_f64(dtype, &raw))
            })
            .collect()
    }

    pub(super) fn read_bits(&self, b: &BufferRef) -> Result<Vec<u64>> {
        let host = self.download(b, &Layout::contiguous([b.len()]))?;
        Ok(host.to_f64_vec().iter().map(|x| x.to_bits()).collect())
    }

    /// `Err(why)` unless every buffer of `a` holds the bits of its peer in `b`.
    fn same_bits(&self, what: &str, a: &[BufferRef], b: &[BufferRef]) -> Result<()> {
        for (x, y) in a.iter().zip(b) {
            if self.read_bits(x)? != self.read_bits(y)? {
                return Err(mismatch(format!(
                    "{what} of a {}-element tensor differs from the per-tensor kernel's",
                    x.len()
                )));
            }
        }
        Ok(())
    }

    fn check_adam(&self, dtype: DType) -> Result<()> {
        let step = |k: usize| AdamStep {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01 * k as f64,
            decoupled: k != 1,
            step: 1 + k as u64,
        };
        let one_by_one = (0..4)
            .map(|r| self.check_values(dtype, r, 0))
            .collect::<Result<Vec<_>>>()?;
        let together = (0..4)
            .map(|r| self.check_values(dtype, r, 0))
            .collect::<Result<Vec<_>>>()?;
        let [p, g, m, v] = [0, 1, 2, 3].map(|r| &one_by_one[r]);
        for (k, (p, g)) in p.iter().zip(g).enumerate() {
            self.adam(p, g, &m[k], &v[k], &step(k))?;
        }
        let items: Vec<AdamOperands> = (0..LENS.len())
            .map(|k| AdamOperands {
                param: &together[0][k],
                grad: &together[1][k],
                exp_avg: &together[2][k],
                exp_avg_sq: &together[3][k],
                step: step(k),
            })
            .collect();
        self.adam_steps_fused(dtype, &items)?;
        for r in [0, 2, 3] {
            self.same_bits("adam_steps", &one_by_one[r], &together[r])?;
        }
        Ok(())
    }

    fn check_sgd(&self, dtype: DType) -> Result<()> {
        let step = |k: usize| SgdStep {
            lr: 0.1,
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 0.01,
            nesterov: k == 3,
            first_step: k == 2,
        };
        let momentum = |k: usize| k != 1;
        let one_by_one = (0..3)
            .map(|r| self.check_values(dtype, r, 5))
            .collect::<Result<Vec<_>>>()?;
        let together = (0..3)
            .map(|r| self.check_values(dtype, r, 5))
            .collect::<Result<Vec<_>>>()?;
        for k in 0..LENS.len() {
            let b = &one_by_one;
            self.sgd(&b[0][k], &b[1][k], momentum(k).then_some(&b[2][k]), &step(k))?;
        }
        let items: Vec<SgdOperands> = (0..LENS.len())
            .map(|k| SgdOperands {
                param: &together[0][k],
                grad: &together[1][k],
                momentum_buf: momentum(k).then_some(&together[2][k]),
                step: step(k),
            })
            .collect();
        self.sgd_steps_fused(dtype, &items)?;
        for r in [0, 2] {
            self.same_bits("sgd_steps", &one_by_one[r], &together[r])?;
        }
        Ok(())
    }

    fn check_sum_of_squares(&self, dtype: DType) -> Result<()> {
        let bufs = self.check_values(dtype, 7, 11)?;
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let got = self.download(&self.sum_of_squares_fused(&refs)?, &Layout::contiguous([1]))?;
        let got = got.to_f64_vec()[0];
        let mut want = 0.0;
        for b in &bufs {
            let host = self.download(b, &Layout::contiguous([b.len()]))?;
            want += host.to_f64_vec().iter().map(|x| x * x).sum::<f64>();
        }
        if (got - want).abs() > 1e-5 * want || got.is_nan() {
            return Err(mismatch(format!(
                "sum_of_squares gives {got} where the host sums {want}"
            )));
        }
        Ok(())
    }

    /// Four non-finite elements (inf and NaN in the 300-element tensor, -inf and NaN in the two
    /// chunks of the last, one in each chunk) among finite ones: the count must be 4.
    fn check_non_finite_count(&self, dtype: DType) -> Result<()> {
        let poisoned = [(2, 17, f64::INFINITY), (2, 200, f64::NAN), (3, 5, f64::NAN)]
            .into_iter()
            .chain([(3, CHUNK_LEN as usize + 2, f64::NEG_INFINITY)]);
        let mut values: Vec<Vec<f64>> = LENS.iter().map(|&n| vec![1.5; n]).collect();
        for (tensor, at, value) in poisoned {
            values[tensor][at] = value;
        }
        let bufs = values
            .iter()
            .map(|v| self.upload(&HostVec::from_f64(dtype, v)))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let got = self.download(&self.non_finite_count_fused(&refs)?, &Layout::contiguous([1]))?;
        match got.to_f64_vec()[0] {
            4.0 => Ok(()),
            other => Err(mismatch(format!(
                "non_finite_count counts {other} inf or NaN elements where there are 4"
            ))),
        }
    }

    fn check_scaled_copies(&self, dtype: DType) -> Result<()> {
        let bufs = self.check_values(dtype, 3, 13)?;
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let factor = self.upload(&HostVec::F32(vec![0.3]))?;
        let got = self.scaled_copies_fused(&refs, &factor)?;
        let one = Layout::contiguous([1]);
        let narrow = self.convert(&factor, &one, dtype)?;
        let want = bufs
            .iter()
            .map(|b| {
                let whole = Layout::contiguous([b.len()]);
                let broadcast = one.broadcast_to("scaled_copies check", &[b.len()].into())?;
                self.zip(BinaryOp::Mul, b, &whole, &narrow, &broadcast)
            })
            .collect::<Result<Vec<_>>>()?;
        self.same_bits("scaled_copies", &got, &want)
    }

    /// The f32 weights' copies in `dtype` (f16 or bf16; nothing to check for f32) equal one
    /// `cast` each bit for bit.
    fn check_cast_copies(&self, dtype: DType) -> Result<()> {
        if dtype == DType::F32 {
            return Ok(());
        }
        let bufs = self.check_values(DType::F32, 5, 29)?;
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let got = self.cast_copies_fused(&refs, dtype)?;
        let want = bufs
            .iter()
            .map(|b| self.convert(b, &Layout::contiguous([b.len()]), dtype))
            .collect::<Result<Vec<_>>>()?;
        self.same_bits("cast_copies", &got, &want)
    }
}

/// A disagreement with the per-tensor kernels, as the error that ends the check.
fn mismatch(why: String) -> lockstep_core::Error {
    lockstep_core::Error::invalid("multi-tensor check", why)
}
