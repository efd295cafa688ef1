//! Causal scaled dot-product attention (PyTorch's `F.scaled_dot_product_attention` with
//! `is_causal=True`), composed from batched products, a masked fill and a softmax that every
//! backend has. Under autocast the products run in the low dtype and the softmax in f32.

use super::Tensor;
use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::Generator;

impl Tensor {
    /// `value` where `mask` (U32, broadcast to this shape) is non-zero, else this tensor; the
    /// gradient flows only to the positions kept.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let fill = Tensor::full([1], value, self.dtype(), self.device())?;
        let out = no_grad(|| mask.where_cond(&fill, self))?;
        if out.shape() != self.shape() {
            return Err(Error::shape(
                "masked_fill",
                self.shape(),
                mask.shape(),
                "the mask must broadcast to the tensor's shape",
            ));
        }
        let mask = mask.detach();
        Ok(out.track("masked_fill", &[self], move |g| {
            let zero = Tensor::zeros([1], g.dtype(), g.device())?;
            Ok(vec![Some(mask.where_cond(&zero, g)?)])
        }))
    }

    /// `softmax(q·kᵀ/sqrt(d) + causal mask)·v` for `q`, `k`, `v` shaped `[batch…, t, d]`: each
    /// position attends to itself and the positions before it. `dropout` (probability, stream)
    /// drops attention weights while training, as PyTorch's `dropout_p` does.
    pub fn causal_attention(&self, k: &Tensor, v: &Tensor, dropout: Option<(f64, &Generator)>) -> Result<Tensor> {
        let q = self;
        let rank = q.rank();
        if rank < 2 || k.shape() != q.shape() || v.shape() != q.shape() {
            return Err(Error::shape(
                "causal_attention",
                q.shape(),
                k.shape(),
                "expects query, key and value of one shape [batch…, t, head_dim]",
            ));
        }
        let (t, d) = (q.dims()[rank - 2], q.dims()[rank - 1]);
        let scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(1.0 / (d as f64).sqrt())?;
        let scores = scores.masked_fill(&causal_mask(t, q.device())?, f64::NEG_INFINITY)?;
        let mut weights = scores.softmax(-1)?;
        if let Some((p, generator)) = dropout {
            weights = weights.dropout(p, true, generator)?;
        }
        weights.matmul(v)
    }
}

/// `[t, t]`, 1 above the diagonal: the future positions a query may not see.
fn causal_mask(t: usize, device: &crate::device::Device) -> Result<Tensor> {
    let positions = Tensor::arange(0, t as i64, DType::F32, device)?;
    let rows = positions.reshape([t, 1])?;
    let cols = positions.reshape([1, t])?;
    cols.gt(&rows)
}
