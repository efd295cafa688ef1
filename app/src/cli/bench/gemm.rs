//! Square f32 matrix products through `Tensor::matmul`.

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
    run_with(device, n, timing, |a, b| a.matmul(b))
}

/// The same measurement of another product kernel (the wgpu naive baseline).
pub fn run_with(
    device: &Device,
    n: usize,
    timing: &Timing,
    product: impl Fn(&Tensor, &Tensor) -> lockstep_core::Result<Tensor>,
) -> anyhow::Result<GemmResult> {
    let generator = Generator::new(0);
    let a = Tensor::rand_normal([n, n], 0.0, 1.0, DType::F32, &generator, device)?;
    let b = Tensor::rand_normal([n, n], 0.0, 1.0, DType::F32, &generator, device)?;
    let m = timing.measure(|| {
        let c = product(&a, &b)?;
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
