//! Replacing every gradient by a copy times a device scalar (clipping's coefficient, the loss
//! scaler's 1/S): one `scaled_copies` call per device and per `SCALED_PER_CALL_BYTES` of
//! gradients, never reading the factor back.

use super::by_device::by_device;
use crate::autograd::no_grad;
use crate::backend::BufferRef;
use crate::error::Result;
use crate::tensor::Tensor;

/// Bytes of gradients one `scaled_copies` call takes: a call's copies live beside the gradients
/// they replace, so this bounds what scaling adds to the peak (a whole copy of the gradients in
/// one call) while a large model still needs few calls.
const SCALED_PER_CALL_BYTES: usize = 16 << 20;

/// Replaces the gradient of each of `params` that has one by `grad * factor` (`factor` a
/// one-element float tensor on any device, converted to each gradient's dtype as `binary`'s
/// `Mul` would). Not in place: two leaves can share one gradient buffer (both operands of a
/// same-shape `add` receive the same tensor), and an in-place write would then scale that buffer
/// twice; a gradient may also be a tensor the caller still holds (the one passed to
/// `backward_with`).
pub(super) fn scale_grads(params: &[Tensor], factor: &Tensor) -> Result<()> {
    no_grad(|| {
        let with_grads = params.iter().filter_map(|p| p.grad().map(|g| (g.device().clone(), p)));
        for (device, group) in by_device(with_grads) {
            let factor = factor.to_device(&device)?.contiguous()?;
            for batch in in_batches(&group, SCALED_PER_CALL_BYTES) {
                let grads = batch
                    .iter()
                    .filter_map(|p| p.grad().map(|g| Ok((*p, g.contiguous()?))))
                    .collect::<Result<Vec<_>>>()?;
                let bufs: Vec<&BufferRef> = grads.iter().map(|(_, g)| g.buffer()).collect();
                let scaled = device.backend().scaled_copies(&bufs, factor.buffer())?;
                for ((p, g), buf) in grads.iter().zip(scaled) {
                    p.set_grad(Some(Tensor::from_buffer(buf, g.shape().clone(), &device)));
                }
            }
        }
        Ok(())
    })
}

/// `params` in runs of at most `bytes` (a larger tensor alone), in order.
fn in_batches<'a>(params: &'a [&'a Tensor], bytes: usize) -> Vec<&'a [&'a Tensor]> {
    let mut runs = Vec::new();
    let (mut start, mut filled) = (0, 0);
    for (i, p) in params.iter().enumerate() {
        let size = p.elem_count() * p.dtype().size_in_bytes();
        if i > start && filled + size > bytes {
            runs.push(&params[start..i]);
            (start, filled) = (i, 0);
        }
        filled += size;
    }
    if start < params.len() {
        runs.push(&params[start..]);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::in_batches;
    use crate::{DType, Device, Tensor};

    #[test]
    fn batches_stay_within_their_bytes_and_a_larger_tensor_goes_alone() {
        let t = |n: usize| Tensor::zeros([n], DType::F32, &Device::cpu()).unwrap();
        // 16, 16, 64 and 8 bytes against a 32-byte batch.
        let params = [t(4), t(4), t(16), t(2)];
        let refs: Vec<&Tensor> = params.iter().collect();
        let sizes: Vec<Vec<usize>> = in_batches(&refs, 32)
            .iter()
            .map(|run| run.iter().map(|p| p.elem_count()).collect())
            .collect();
        assert_eq!(sizes, vec![vec![4, 4], vec![16], vec![2]]);
        assert!(in_batches(&[], 32).is_empty());
    }
}
