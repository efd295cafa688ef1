//! Square matrix products through `Tensor::matmul`, in f32 or bf16.

use lockstep_core::{DType, Device, Generator, Tensor};
use serde::{Deserialize, Serialize};

use super::timing::Timing;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmResult {
    pub n: usize,
    pub median_s: f64,
    pub gflops: f64,
    pub reps: usize,
}

pub fn run(device: &Device, n: usize, timing: &Timing) -> anyhow::Result<GemmResult> {
    run_in(device, n, DType::F32, timing)
}

/// `run` with operands of `dtype` (cast once, before timing).
pub fn run_in(device: &Device, n: usize, dtype: DType, timing: &Timing) -> anyhow::Result<GemmResult> {
    let (a, b) = (operand(n, dtype, device, 0)?, operand(n, dtype, device, 1)?);
    time_product(device, n, timing, || a.matmul(&b))
}

/// The same measurement of another f32 product kernel (the wgpu naive baseline).
pub fn run_with(
    device: &Device,
    n: usize,
    timing: &Timing,
    product: impl Fn(&Tensor, &Tensor) -> lockstep_core::Result<Tensor>,
) -> anyhow::Result<GemmResult> {
    let (a, b) = (operand(n, DType::F32, device, 0)?, operand(n, DType::F32, device, 1)?);
    time_product(device, n, timing, || product(&a, &b))
}

fn operand(n: usize, dtype: DType, device: &Device, seed: u64) -> lockstep_core::Result<Tensor> {
    Tensor::rand_normal([n, n], 0.0, 1.0, DType::F32, &Generator::new(seed), device)?.to_dtype(dtype)
}

fn time_product(
    device: &Device,
    n: usize,
    timing: &Timing,
    product: impl Fn() -> lockstep_core::Result<Tensor>,
) -> anyhow::Result<GemmResult> {
    let m = timing.measure(|| {
        let c = product()?;
        device.synchronize()?;
        drop(c);
        Ok(())
    })?;
    let flops = 2.0 * (n as f64).powi(3);
    Ok(GemmResult {
        n,
        median_s: m.median_s,
        gflops: flops / m.median_s / 1e9,
        reps: m.reps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_product_reports_a_rate() {
        let t = Timing {
            warmup: 1,
            min_reps: 2,
            max_reps: 2,
            min_seconds: 0.0,
        };
        let r = run(&Device::cpu(), 32, &t).expect("gemm bench runs");
        assert_eq!((r.n, r.reps), (32, 2));
        assert!(r.gflops.is_finite() && r.gflops > 0.0);
    }
}
