//! A backend's fused bias and activation gradient (`Backend::bias_act_grad`) against the ops it
//! fuses on the same device. The contract asks for their bits, not just their values within a
//! tolerance: a run takes whichever path the backend offers, and a fused kernel that rounded
//! once where the composed ops round three times would drift from the composed path on a device
//! without the kernel. The values include NaN, infinities and signed zeros.

use crate::backend::{BiasGeometry, UnaryOp};
use crate::device::Device;
use crate::dtype::{DType, HostVec};
use crate::error::Result;
use crate::rng::Generator;
use crate::tensor::{Tensor, unary_grad};

/// The shapes where `device`'s fused GELU input gradient in `dtype` differs from the composed
/// add, GELU derivative and multiply, one line each; `None` where the backend has no fused
/// kernel. The shapes: a linear layer's rows, a convolution's channels, and rows past the
/// CPU's parallel threshold.
pub fn bias_act_grad_mismatches(device: &Device, dtype: DType) -> Result<Option<Vec<String>>> {
    let shapes: [(&[usize], usize); 3] = [(&[5, 7], 1), (&[2, 3, 4, 5], 1), (&[600, 300], 1)];
    let mut mismatches = Vec::new();
    for (dims, axis) in shapes {
        let x = values(dims, 1, dtype, device)?;
        let b = values(&[dims[axis]], 2, dtype, device)?;
        let g = values(dims, 3, dtype, device)?;
        let geom = BiasGeometry {
            outer: dims[..axis].iter().product(),
            channels: dims[axis],
            inner: dims[axis + 1..].iter().product(),
        };
        let backend = device.backend();
        let Some(fused) = backend.bias_act_grad(g.buffer(), x.buffer(), b.buffer(), geom, UnaryOp::GeluGrad) else {
            return Ok(None);
        };
        let fused = Tensor::from_buffer(fused?, x.shape().clone(), device);
        let mut along = vec![1; dims.len()];
        along[axis] = dims[axis];
        let pre = x.add(&b.reshape(along)?)?;
        let composed = unary_grad(UnaryOp::Gelu, Some(&pre), &g)?;
        let (fused, composed) = (bits(&fused)?, bits(&composed)?);
        if let Some(at) = (0..fused.len()).find(|&i| !same_bits(fused[i], composed[i])) {
            mismatches.push(format!(
                "{dtype:?} {dims:?}: element {at} is {} fused, {} composed",
                f64::from_bits(fused[at]),
                f64::from_bits(composed[at])
            ));
        }
    }
    Ok(Some(mismatches))
}

/// Normal values of spread 3 in `dtype`, with a NaN, infinities and signed zeros among them,
/// drawn on the CPU so every device gets the same ones.
pub(super) fn values(dims: &[usize], seed: u64, dtype: DType, device: &Device) -> Result<Tensor> {
    let cpu = Device::cpu();
    let x = Tensor::rand_normal(dims.to_vec(), 0.0, 3.0, DType::F64, &Generator::new(seed), &cpu)?;
    let mut v = x.to_vec::<f64>()?;
    let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 40.0, -40.0];
    for (i, s) in specials.into_iter().enumerate() {
        let at = (i * 7919 + seed as usize) % v.len();
        v[at] = s;
    }
    Tensor::from_host(HostVec::from_f64(dtype, &v), dims.to_vec(), device)
}

pub(super) fn bits(t: &Tensor) -> Result<Vec<u64>> {
    Ok(t.to_host()?.to_f64_vec().iter().map(|v| v.to_bits()).collect())
}

/// Whether two elements' `bits` agree: the same, or both a NaN. A NaN's sign and payload are
/// the compiler's and the driver's choice (WGSL and SPIR-V leave them open, and lavapipe's
/// differ between CPUs), and a NaN stays a NaN either way.
pub(super) fn same_bits(a: u64, b: u64) -> bool {
    a == b || (f64::from_bits(a).is_nan() && f64::from_bits(b).is_nan())
}
