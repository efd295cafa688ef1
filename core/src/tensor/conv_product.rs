//! The product at the heart of a convolution, `[o, c/g·kh·kw] @ im2col(x)` per group, as one
//! tracked operation that keeps the input rather than its columns for the backward pass. The
//! columns are kh·kw times the input (9x for a 3x3 convolution): a ResNet-18 step at batch 64
//! would otherwise hold about a gigabyte of them between forward and backward. The backward
//! unfolds them again, which costs one memory-bound pass beside two GEMMs. Backends with a
//! fused kernel (`Backend::conv2d_product`, the CPU's) do all of it a few images at a time instead.

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
        let grad = grad.reshape([groups, o / groups, pixels])?;
        let grad_weight = {
            let cols = x_kept.im2col(geom)?.reshape([groups, taps, pixels])?;
            grad.matmul(&cols.transpose(1, 2)?)?.reshape(weight_dims)?
        };
        let kernels = weight_kept.reshape([groups, o / groups, taps])?;
        let grad_cols = kernels.transpose(1, 2)?.matmul(&grad)?;
        let grad_x = grad_cols.reshape([geom.c * geom.kh * geom.kw, pixels])?.col2im(geom)?;
        Ok(vec![Some(grad_x), Some(grad_weight)])
    }))
}
