//! Causal scaled dot-product attention (PyTorch's `F.scaled_dot_product_attention` with
//! `is_causal=True`), composed from batched products, a masked fill and a softmax that every
//! backend has. Under autocast the products run in the low dtype and the softmax in f32.

use super::Tensor;
use crate::autograd::no_grad;
use crate::backend::{CausalAttention, CausalSoftmax, DropoutDraw};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::{BatchWindow, Generator};

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
        let d = q.dims()[rank - 1];
        let scores = q.matmul(&k.transpose(-2, -1)?)?;
        scores.causal_softmax(1.0 / (d as f64).sqrt(), dropout)?.matmul(v)
    }

    /// Causal attention of every head of a fused projection: `self` is `[batch, t, 3, heads,
    /// head_dim]` with queries, keys and values in slots 0, 1, 2; returns `[batch, t, heads,
    /// head_dim]`, each head's `causal_attention` of its slots. One pass each way without the
    /// `t × t` weights where the backend fuses it (`Backend::causal_attention`; matrix-product
    /// inputs under autocast, as the composed products take them), else composed from the
    /// slots' views. Dropout on the weights draws the same elements either way (the stream is
    /// reserved here, as `causal_softmax` reserves it).
    pub fn causal_self_attention(&self, dropout: Option<(f64, &Generator)>) -> Result<Tensor> {
        let &[batch, t, 3, heads, head_dim] = self.dims() else {
            return Err(Error::invalid(
                "causal_self_attention",
                format!(
                    "expects [batch, t, 3, heads, head_dim] queries, keys and values, got shape {}",
                    self.shape()
                ),
            ));
        };
        self.float_only("causal_self_attention")?;
        let dropout = dropout.filter(|(p, _)| *p > 0.0);
        // Drawn over the `[batch, heads, t, t]` weights, led by the batch, as `causal_softmax`
        // draws it on the composed path.
        let mut reserved = None;
        if let Some(draw) = fused_dropout(dropout, batch * heads * t * t, batch) {
            let spec = CausalAttention {
                batch,
                heads,
                t,
                head_dim,
                scale: 1.0 / (head_dim as f64).sqrt(),
                dropout: draw,
            };
            if let Some(y) = self.causal_attention_fused(spec)? {
                return Ok(y);
            }
            // Declined: the composed path draws from the part of the stream reserved above.
            reserved = reserved_stream(draw);
        }
        let dropout = match &reserved {
            Some((p, generator)) => Some((*p, generator)),
            None => dropout,
        };
        // [3, batch, heads, t, head_dim]: one permuted view, each of q, k, v a slice of it.
        let qkv = self.permute(&[2, 0, 3, 1, 4])?;
        let part = |i: usize| qkv.narrow(0, i, 1)?.squeeze(0);
        let y = part(0)?.causal_attention(&part(1)?, &part(2)?, dropout)?;
        y.transpose(1, 2)?.contiguous()
    }

    /// `Backend::causal_attention` and its backward pass, or `None` where the backend declines.
    fn causal_attention_fused(&self, spec: CausalAttention) -> Result<Option<Tensor>> {
        let qkv = crate::autocast::lower(self)?.contiguous()?;
        let Some(fused) = qkv.backend().causal_attention(qkv.buffer(), &spec) else {
            return Ok(None);
        };
        let (y, lse) = fused?;
        let y = Tensor::from_buffer(y, [spec.batch, spec.t, spec.heads, spec.head_dim], qkv.device());
        let saved = (qkv.detach(), y.detach());
        Ok(Some(y.track("causal_attention", &[&qkv], move |g| {
            let (qkv, y) = saved;
            let g = g.to_dtype(qkv.dtype())?.contiguous()?;
            let dqkv = qkv
                .backend()
                .causal_attention_backward(qkv.buffer(), y.buffer(), &lse, g.buffer(), &spec)
                .ok_or_else(|| {
                    Error::invalid(
                        "causal_attention",
                        "the backend fused the forward pass but has no backward pass for it",
                    )
                })??;
            Ok(vec![Some(Tensor::from_buffer(dqkv, qkv.shape().clone(), qkv.device()))])
        })))
    }

    /// Attention's weights from `[batch…, t, t]` scores: `dropout(softmax(self * scale))` over
    /// the last axis with each query's future keys masked. One pass each way where the backend
    /// fuses it (`Backend::causal_softmax`), else composed from the scale, a masked fill, the
    /// softmax and dropout, drawing the same stream; in f32 both give the same bits. Fused, the
    /// weights stay in the scores' dtype (as PyTorch's attention under autocast) and the
    /// backward pass keeps the scores instead of the weights.
    pub fn causal_softmax(&self, scale: f64, dropout: Option<(f64, &Generator)>) -> Result<Tensor> {
        let rank = self.rank();
        let t = self.dims().last().copied().unwrap_or(0);
        if rank < 2 || self.dims()[rank - 2] != t {
            return Err(Error::invalid(
                "causal_softmax",
                format!("expects square [batch…, t, t] scores, got shape {}", self.shape()),
            ));
        }
        self.float_only("causal_softmax")?;
        // Drawn here, so both paths take the same part of the stream (`fused_dropout`).
        let Some(draw) = fused_dropout(dropout, self.elem_count(), self.dims()[0]) else {
            return self.causal_softmax_composed(scale, dropout);
        };
        let x = self.contiguous()?;
        let spec = CausalSoftmax {
            rows: x.elem_count().checked_div(t).unwrap_or(0),
            t,
            scale,
            dropout: draw,
        };
        if let Some(weights) = x.backend().causal_softmax(x.buffer(), &spec) {
            let out = Tensor::from_buffer(weights?, x.shape().clone(), x.device());
            let scores = x.detach();
            return Ok(out.track("causal_softmax", &[&x], move |g| {
                let g = g.to_dtype(scores.dtype())?.contiguous()?;
                let dx = scores
                    .backend()
                    .causal_softmax_backward(g.buffer(), scores.buffer(), &spec)
                    .ok_or_else(|| {
                        Error::invalid(
                            "causal_softmax",
                            "the backend fused the forward pass but has no backward pass for it",
                        )
                    })??;
                Ok(vec![Some(Tensor::from_buffer(dx, g.shape().clone(), g.device()))])
            }));
        }
        let stream = reserved_stream(draw);
        self.causal_softmax_composed(scale, stream.as_ref().map(|(p, g)| (*p, g)))
    }

    /// `causal_softmax` from the scale, a masked fill, the softmax and dropout.
    fn causal_softmax_composed(&self, scale: f64, dropout: Option<(f64, &Generator)>) -> Result<Tensor> {
        let t = self.dims()[self.rank() - 1];
        let scores = self.mul_scalar(scale)?;
        let scores = scores.masked_fill(&causal_mask(t, self.device())?, f64::NEG_INFINITY)?;
        let weights = scores.softmax(-1)?;
        match dropout {
            Some((p, generator)) => weights.dropout(p, true, generator),
            None => Ok(weights),
        }
    }
}

/// `dropout` over `len` elements led by an axis of `leading` as fused kernels draw it: `Some`
/// with the stream reserved (`Some(None)` without dropout), or `None` where only the composed
/// path can draw it (p ≥ 1, or a replica's part of the global batch's stream starting inside a
/// Philox block, `BatchWindow`), nothing reserved.
fn fused_dropout(dropout: Option<(f64, &Generator)>, len: usize, leading: usize) -> Option<Option<DropoutDraw>> {
    let Some((p, generator)) = dropout.filter(|(p, _)| *p > 0.0) else {
        return Some(None);
    };
    if p >= 1.0 || BatchWindow::starts_inside_a_block(len, leading) {
        return None;
    }
    let counter = generator.reserve(len, leading).counter;
    Some(Some(DropoutDraw {
        p,
        seed: generator.seed(),
        counter,
    }))
}

/// The stream a `fused_dropout` draw reserved, for the composed path when the fused one declines.
fn reserved_stream(draw: Option<DropoutDraw>) -> Option<(f64, Generator)> {
    draw.map(|d| (d.p, Generator::from_state(d.seed, d.counter)))
}

/// `[t, t]`, 1 above the diagonal: the future positions a query may not see.
fn causal_mask(t: usize, device: &crate::device::Device) -> Result<Tensor> {
    let positions = Tensor::arange(0, t as i64, DType::F32, device)?;
    let rows = positions.reshape([t, 1])?;
    let cols = positions.reshape([1, t])?;
    cols.gt(&rows)
}
