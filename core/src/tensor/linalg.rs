//! Matrix products with broadcast batch dimensions.

use super::Tensor;
use crate::backend::MatmulDims;
use crate::error::{Error, Result};
use crate::shape::{Layout, Shape};

/// Folds the batch axes of a `[batch…, rows, cols]` layout into one `[batch, rows, cols]`
/// layout when a single stride can step through them; None when it cannot.
fn fold_batch(layout: &Layout, batch: usize) -> Option<Layout> {
    let r = layout.shape.rank();
    let mut stride: Option<usize> = None;
    let mut span = 1usize;
    for i in (0..r - 2).rev() {
        let (d, s) = (layout.dims()[i], layout.strides[i]);
        if d == 1 {
            continue;
        }
        match stride {
            None => stride = Some(s),
            Some(inner) if s == inner * span => {}
            Some(_) => return None,
        }
        span *= d;
    }
    Some(Layout {
        shape: Shape::new([batch, layout.dims()[r - 2], layout.dims()[r - 1]]),
        strides: vec![stride.unwrap_or(0), layout.strides[r - 2], layout.strides[r - 1]],
        offset: layout.offset,
    })
}

/// True when the last two axes are stored column-major (a transposed view).
fn is_transposed(t: &Tensor) -> bool {
    let (s, d) = (&t.layout().strides, t.dims());
    let r = t.rank();
    r >= 2 && s[r - 2] == 1 && s[r - 1] == d[r - 2] && d[r - 2] > 1
}

impl Tensor {
    /// `self @ rhs` over the last two axes, broadcasting the leading (batch) axes as PyTorch does.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if let Some(low) = crate::autocast::recast(&[self, rhs], crate::autocast::lower)? {
            return low[0].matmul(&low[1]);
        }
        self.same_device("matmul", rhs)?;
        self.same_dtype("matmul", rhs)?;
        self.float_only("matmul")?;
        if self.rank() < 2 || rhs.rank() < 2 {
            return Err(Error::shape(
                "matmul",
                self.shape(),
                rhs.shape(),
                "both operands need at least two axes; unsqueeze vectors first",
            ));
        }
        let (m, k) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        let (k2, n) = (rhs.dims()[rhs.rank() - 2], rhs.dims()[rhs.rank() - 1]);
        if k != k2 {
            return Err(Error::shape(
                "matmul",
                self.shape(),
                rhs.shape(),
                format!("inner dimensions {k} and {k2} differ"),
            ));
        }
        // A batch of rows times one matrix (a Linear layer on [batch, t, features]) is one
        // product of all the rows: one GEMM instead of a batched one, and the matrix's gradient
        // needs no per-batch copies summed afterwards.
        if rhs.rank() == 2 && self.rank() > 2 {
            let mut dims = self.dims()[..self.rank() - 1].to_vec();
            let rows = dims.iter().product::<usize>();
            dims.push(n);
            return self.reshape([rows, k])?.matmul(rhs)?.reshape(dims);
        }
        // Fix: name the operands' full shapes when the batch axes do not broadcast.
        let batch_shape = Shape::broadcast(
            "matmul",
            &Shape::new(&self.dims()[..self.rank() - 2]),
            &Shape::new(&rhs.dims()[..rhs.rank() - 2]),
        )
        .map_err(|_| {
            Error::shape(
                "matmul",
                self.shape(),
                rhs.shape(),
                "the batch axes (all but the last two) do not broadcast",
            )
        })?;
        let batch = batch_shape.elem_count();
        let with = |rows: usize, cols: usize| {
            let mut d = batch_shape.dims().to_vec();
            d.extend([rows, cols]);
            Shape::new(d)
        };
        let operand = |t: &Tensor, rows, cols| -> Result<(Tensor, Layout)> {
            let l = t.layout().broadcast_to("matmul", &with(rows, cols))?;
            match fold_batch(&l, batch) {
                Some(folded) => Ok((t.clone(), folded)),
                None => {
                    let c = t.broadcast_as(&with(rows, cols))?.contiguous()?;
                    let folded = fold_batch(c.layout(), batch).expect("contiguous layouts fold");
                    Ok((c, folded))
                }
            }
        };
        let (a, la) = operand(self, m, k)?;
        let (b, lb) = operand(rhs, k, n)?;
        let buffer = self
            .backend()
            .matmul(a.buffer(), &la, b.buffer(), &lb, MatmulDims { batch, m, n, k })?;
        let out = Tensor::from_buffer(buffer, with(m, n), self.device());
        let (x, y) = (self.detach(), rhs.detach());
        let (sa, sb) = (self.shape().clone(), rhs.shape().clone());
        // A product costs as much as the forward pass: skip the ones nobody needs (e.g. the
        // gradient of the input batch).
        let (need_a, need_b) = (self.tracks_grad(), rhs.tracks_grad());
        // Each gradient is produced in its input's memory order: a transposed input (Linear's
        // weight) gets a transposed gradient view, which is contiguous once transposed back, so
        // no copy is needed to store it.
        let (a_t, b_t) = (is_transposed(self), is_transposed(rhs));
        Ok(out.track("matmul", &[self, rhs], move |g| {
            let ga = match (need_a, a_t) {
                (false, _) => None,
                (true, false) => Some(g.matmul(&y.t()?)?),
                (true, true) => Some(y.matmul(&g.t()?)?.t()?),
            };
            let gb = match (need_b, b_t) {
                (false, _) => None,
                (true, false) => Some(x.t()?.matmul(g)?),
                (true, true) => Some(g.t()?.matmul(&x)?.t()?),
            };
            Ok(vec![
                ga.map(|t| t.sum_to_shape(&sa)).transpose()?,
                gb.map(|t| t.sum_to_shape(&sb)).transpose()?,
            ])
        }))
    }
}
