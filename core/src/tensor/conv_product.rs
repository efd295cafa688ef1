//! The product at the heart of a convolution, `[o, c/g·kh·kw] @ im2col(x)` per group, as one
//! tracked operation that keeps the input rather than its columns for the backward pass. The
//! columns are kh·kw times the input (9x for a 3x3 convolution): a ResNet-18 step at batch 64
//! would otherwise hold about a gigabyte of them between forward and backward. The backward
//! unfolds them again, which costs one memory-bound pass beside two GEMMs. Backends with a
//! fused kernel (`Backend::conv2d_product`) do all of it without columns: the CPU a few images at a
//! time, wgpu as implicit GEMM.

use super::Tensor;
use crate::autograd::no_grad;
use crate::backend::Conv2dGeometry;
use crate::error::Result;

/// `weight` `[o, c/groups, kh, kw]` times the columns of `x` `[n, c, h, w]` under `geom`:
/// the convolution's output as `[o, n·oh·ow]` (no bias).
pub(super) fn conv_product(x: &Tensor, weight: &Tensor, geom: Conv2dGeometry, groups: usize) -> Result<Tensor> {
    let o = weight.dims()[0];
    let taps = geom.c / groups * geom.kh * geom.kw;
    let pixels = geom.n * geom.out_h() * geom.out_w();
    let product = |x: &Tensor, weight: &Tensor| -> Result<Tensor> {
        let cols = x.im2col(geom)?.reshape([groups, taps, pixels])?;
        weight
            .reshape([groups, o / groups, taps])?
            .matmul(&cols)?
            .reshape([o, pixels])
    };
    let (x_kept, weight_kept) = (x.detach().contiguous()?, weight.detach().contiguous()?);
    let weight_dims = weight.dims().to_vec();
    let fused = match groups {
        1 => x
            .backend()
            .conv2d_product(x_kept.buffer(), weight_kept.buffer(), &geom, o),
        _ => None,
    };
    let out = match fused {
        Some(out) => Tensor::from_buffer(out?, [o, pixels], x.device()),
        None => no_grad(|| product(x, weight))?,
    };
    Ok(out.track("conv2d", &[x, weight], move |grad| {
        let grad = grad.contiguous()?;
        if groups == 1
            && let Some(grads) =
                grad.backend()
                    .conv2d_product_backward(x_kept.buffer(), weight_kept.buffer(), grad.buffer(), &geom, o)
        {
            let (grad_x, grad_weight) = grads?;
            let device = grad.device();
            return Ok(vec![
                Some(Tensor::from_buffer(grad_x, [geom.n, geom.c, geom.h, geom.w], device)),
                Some(Tensor::from_buffer(grad_weight, weight_dims, device)),
            ]);
        }
        composed_grads(&x_kept, &weight_kept, &grad, geom, groups)
    }))
}

/// The whole convolution (one group, no bias) by the backend's library (cuDNN), NCHW in and
/// out, tracked: `[n, o, oh, ow]`, or `None` where the backend has no such path for it.
pub(super) fn conv_nchw(x: &Tensor, weight: &Tensor, geom: Conv2dGeometry) -> Result<Option<Tensor>> {
    let o = weight.dims()[0];
    let (x_kept, weight_kept) = (x.detach().contiguous()?, weight.detach().contiguous()?);
    let Some(out) = x.backend().conv2d_nchw(x_kept.buffer(), weight_kept.buffer(), &geom, o) else {
        return Ok(None);
    };
    let (oh, ow) = (geom.out_h(), geom.out_w());
    let out = Tensor::from_buffer(out?, [geom.n, o, oh, ow], x.device());
    Ok(Some(out.track("conv2d", &[x, weight], move |grad| {
        let grad = grad.contiguous()?;
        match grad
            .backend()
            .conv2d_nchw_backward(x_kept.buffer(), weight_kept.buffer(), grad.buffer(), &geom, o)
        {
            Some(grads) => {
                let (grad_x, grad_weight) = grads?;
                let device = grad.device();
                Ok(vec![
                    Some(Tensor::from_buffer(grad_x, [geom.n, geom.c, geom.h, geom.w], device)),
                    Some(Tensor::from_buffer(grad_weight, weight_kept.dims().to_vec(), device)),
                ])
            }
            None => {
                // The library took the forward pass but declines this backward: unfold instead.
                let flat = grad
                    .reshape([geom.n, o, oh * ow])?
                    .permute(&[1, 0, 2])?
                    .reshape([o, geom.n * oh * ow])?;
                composed_grads(&x_kept, &weight_kept, &flat, geom, 1)
            }
        }
    })))
}

/// `[grad_x, grad_weight]` of `conv_product` from its output gradient `[o, n·oh·ow]` by unfolding:
/// one GEMM per group each, and col2im.
fn composed_grads(
    x: &Tensor,
    weight: &Tensor,
    grad: &Tensor,
    geom: Conv2dGeometry,
    groups: usize,
) -> Result<Vec<Option<Tensor>>> {
    let o = weight.dims()[0];
    let taps = geom.c / groups * geom.kh * geom.kw;
    let pixels = geom.n * geom.out_h() * geom.out_w();
    let grad = grad.reshape([groups, o / groups, pixels])?;
    let grad_weight = {
        let cols = x.im2col(geom)?.reshape([groups, taps, pixels])?;
        grad.matmul(&cols.transpose(1, 2)?)?.reshape(weight.dims().to_vec())?
    };
    let kernels = weight.reshape([groups, o / groups, taps])?;
    let grad_cols = kernels.transpose(1, 2)?.matmul(&grad)?;
    let grad_x = grad_cols.reshape([geom.c * geom.kh * geom.kw, pixels])?.col2im(geom)?;
    Ok(vec![Some(grad_x), Some(grad_weight)])
}
