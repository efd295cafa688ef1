//! The fused attention's start-up check: before its first use for a dtype and head dim, the
//! kernels run one small case (two heads, 80 tokens: a full 64-row tile and a partial one)
//! forward and backward, compared with plain f64 attention on the host within the conformance
//! suite's tolerance for the fused cases. A mismatch or a failed launch prints one line and
//! that dtype and head dim compose from then on: a fast path that can be wrong on some device
//! steps aside.

use lockstep_core::backend::CausalAttention;
use lockstep_core::conformance::Tolerance;
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::CudaBackend;

/// The fused cases' tolerance scale in the conformance suite (cases/transformer.rs).
const TOLERANCE_SCALE: f64 = 4.0;

impl CudaBackend {
    /// Whether the fused kernels for `dtype` and `head_dim` passed their check (run on first ask).
    pub(crate) fn attention_passes_check(&self, dtype: DType, head_dim: usize) -> bool {
        let mut checks = self.attention_checks.lock().unwrap_or_else(|p| p.into_inner());
        *checks.entry((dtype, head_dim)).or_insert_with(|| {
            let verdict = self.check_attention(dtype, head_dim);
            if let Err(why) = &verdict {
                eprintln!(
                    "warning: {}: the fused attention kernels ({dtype}, head dim {head_dim}) failed their start-up \
                     check ({why}); attention composes from products and causal_softmax instead \
                     (LOCKSTEP_CUDA_ATTENTION=fused forces the kernels)",
                    self.gpu.location
                );
            }
            verdict.is_ok()
        })
    }

    /// `Err` with the first disagreement, or the error that stopped the kernels.
    fn check_attention(&self, dtype: DType, head_dim: usize) -> std::result::Result<(), String> {
        let spec = CausalAttention {
            batch: 1,
            heads: 2,
            t: 80,
            head_dim,
            scale: 1.0 / (head_dim as f64).sqrt(),
            dropout: None,
        };
        // Values in [-2, 2) (as the conformance cases draw them), rounded to the dtype.
        let draw = |len: usize, salt: usize| {
            let raw: Vec<f64> = (0..len)
                .map(|i| ((i * 7919 + salt) % 1031) as f64 / 257.75 - 2.0)
                .collect();
            HostVec::from_f64(dtype, &raw)
        };
        let (qkv, dy) = (draw(spec.qkv_len(), 17), draw(spec.out_len(), 29));
        let run = || -> Result<(Vec<f64>, Vec<f64>)> {
            let qkv_buffer = self.upload(&qkv)?;
            let dy_buffer = self.upload(&dy)?;
            let (y, lse) = self.attention_forward(&qkv_buffer, &spec)?;
            let dqkv = self.attention_backward([&qkv_buffer, &y, &lse, &dy_buffer], &spec)?;
            let read = |b, len| self.download(b, &Layout::contiguous([len])).map(|h| h.to_f64_vec());
            Ok((read(&y, spec.out_len())?, read(&dqkv, spec.qkv_len())?))
        };
        let (y, dqkv) = run().map_err(|e| e.to_string())?;
        let (want_y, want_dqkv) = reference(&spec, &qkv.to_f64_vec(), &dy.to_f64_vec());
        let tolerance = Tolerance::for_dtype(dtype).scaled(TOLERANCE_SCALE);
        for (what, got, want) in [("y", &y, &want_y), ("dqkv", &dqkv, &want_dqkv)] {
            if let Some(i) = (0..want.len()).find(|&i| !tolerance.accepts(got[i], want[i])) {
                return Err(format!(
                    "{what}[{i}] is {} where plain attention gives {}",
                    got[i], want[i]
                ));
            }
        }
        Ok(())
    }
}

/// y `[batch, t, heads, d]` and dqkv `[batch, t, 3, heads, d]` of plain causal attention in f64.
fn reference(spec: &CausalAttention, qkv: &[f64], dy: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (t, h, d) = (spec.t, spec.heads, spec.head_dim);
    let at = |b: usize, pos: usize, slot: usize, head: usize| ((b * t + pos) * 3 + slot) * h * d + head * d;
    let out_at = |b: usize, pos: usize, head: usize| ((b * t + pos) * h + head) * d;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let (mut y, mut dqkv) = (vec![0.0; spec.out_len()], vec![0.0; spec.qkv_len()]);
    for b in 0..spec.batch {
        for head in 0..h {
            for i in 0..t {
                let q = &qkv[at(b, i, 0, head)..][..d];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| dot(q, &qkv[at(b, j, 1, head)..][..d]) * spec.scale)
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|e| e / sum).collect();
                let g = &dy[out_at(b, i, head)..][..d];
                let dp: Vec<f64> = (0..=i).map(|j| dot(g, &qkv[at(b, j, 2, head)..][..d])).collect();
                let row_dot = dot(&p, &dp);
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - row_dot) * spec.scale;
                    for c in 0..d {
                        y[out_at(b, i, head) + c] += p[j] * qkv[at(b, j, 2, head) + c];
                        dqkv[at(b, i, 0, head) + c] += ds * qkv[at(b, j, 1, head) + c];
                        dqkv[at(b, j, 1, head) + c] += ds * qkv[at(b, i, 0, head) + c];
                        dqkv[at(b, j, 2, head) + c] += p[j] * g[c];
                    }
                }
            }
        }
    }
    (y, dqkv)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference against finite differences of `sum(y · dy)`: the check itself must be right.
    #[test]
    fn the_reference_gradient_matches_finite_differences() {
        let spec = CausalAttention {
            batch: 2,
            heads: 2,
            t: 5,
            head_dim: 3,
            scale: 0.7,
            dropout: None,
        };
        let qkv: Vec<f64> = (0..spec.qkv_len())
            .map(|i| ((i * 37) % 23) as f64 / 11.0 - 1.0)
            .collect();
        let dy: Vec<f64> = (0..spec.out_len())
            .map(|i| ((i * 13) % 17) as f64 / 8.0 - 1.0)
            .collect();
        let (_, grad) = reference(&spec, &qkv, &dy);
        let objective = |x: &[f64]| {
            reference(&spec, x, &dy)
                .0
                .iter()
                .zip(&dy)
                .map(|(y, g)| y * g)
                .sum::<f64>()
        };
        for i in 0..qkv.len() {
            let (mut up, mut down) = (qkv.clone(), qkv.clone());
            up[i] += 1e-6;
            down[i] -= 1e-6;
            let numeric = (objective(&up) - objective(&down)) / 2e-6;
            assert!(
                (numeric - grad[i]).abs() < 1e-6,
                "element {i}: {numeric} vs {}",
                grad[i]
            );
        }
    }
}
