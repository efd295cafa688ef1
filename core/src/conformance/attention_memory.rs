//! Whether a device's causal attention keeps a t × t matrix: its peak memory over one forward
//! and backward pass at two sequence lengths. A fused (flash-style) kernel grows about linearly
//! with t; the composed path's scores and weights grow it quadratically.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Checks that the fused attention's peak grows at most 2.5x from t = 256 to t = 512 (2 heads
/// of 16, batch 1) while the composed path's grows at least 3x (else the measure could not tell
/// them apart). `fresh_device(fused, t)` opens a device anew for each pass, with the fused path
/// on or off, so nothing else counts in its peak. Returns the two growths in words.
pub fn check_attention_memory_is_linear(fresh_device: &mut dyn FnMut(bool, usize) -> Result<Device>) -> Result<String> {
    let mut growth = |fused: bool| -> Result<f64> {
        let short = attention_peak_bytes(&fresh_device(fused, 256)?, 256)?;
        let long = attention_peak_bytes(&fresh_device(fused, 512)?, 512)?;
        Ok(long as f64 / short as f64)
    };
    let (fused, composed) = (growth(true)?, growth(false)?);
    let summary = format!("peak bytes from t = 256 to 512: fused x{fused:.2}, composed x{composed:.2}");
    if fused > 2.5 {
        return Err(Error::invalid(
            "causal_attention",
            format!("the fused peak grows with t x t: {summary}"),
        ));
    }
    if composed < 3.0 {
        return Err(Error::invalid(
            "causal_attention",
            format!("the composed peak grew too little to tell the paths apart: {summary}"),
        ));
    }
    Ok(summary)
}

/// The device's peak allocated bytes after one forward and backward pass of causal attention
/// over `t` tokens, whose input gradient must be finite.
pub fn attention_peak_bytes(device: &Device, t: usize) -> Result<u64> {
    let host = Tensor::rand_normal(
        [1, t, 3, 2, 16],
        0.0,
        1.0,
        DType::F32,
        &Generator::new(1),
        &Device::cpu(),
    )?;
    let qkv = host.to_device(device)?.requires_grad(true);
    qkv.causal_self_attention(None)?.sum_all()?.backward()?;
    let grad = qkv
        .grad()
        .ok_or_else(|| Error::Autograd("attention gave its input no gradient".into()))?;
    if !grad.to_vec::<f32>()?.iter().all(|g| g.is_finite()) {
        return Err(Error::Autograd("attention's input gradient is not finite".into()));
    }
    Ok(device.backend().memory_stats().peak_allocated_bytes)
}
