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

impl Tensor {
    /// `self @ rhs` over the last two axes, broadcasting the leading (batch) axes as PyTorch does.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.same_device("matmul", rhs)?;
        self.same_dtype("matmul", rhs)?;
        self.float_only("matmul")?;
        if self.rank() < 2 || rhs.rank() < 2 {
            return Err(Error::shape("matmul", self.shape(), rhs.shape(), "both operands need at least two axes; unsqueeze vectors first"));
        }
        let (m, k) = (self.dims()[self.rank() - 2], self.dims()[self.rank() - 1]);
        let (k2, n) = (rhs.dims()[rhs.rank() - 2], rhs.dims()[rhs.rank() - 1]);
        if k != k2 {
            return Err(Error::shape("matmul", self.shape(), rhs.shape(), format!("inner dimensions {k} and {k2} differ")));
        }
        let batch_shape = Shape::broadcast("matmul", &Shape::new(&self.dims()[..self.rank() - 2]), &Shape::new(&rhs.dims()[..rhs.rank() - 2]))?;
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
        let buffer = self.backend().matmul(a.buffer(), &la, b.buffer(), &lb, MatmulDims { batch, m, n, k })?;
        let out = Tensor::from_buffer(buffer, with(m, n), self.device());
        let (x, y) = (self.detach(), rhs.detach());
        let (sa, sb) = (self.shape().clone(), rhs.shape().clone());
        Ok(out.track("matmul", &[self, rhs], move |g| {
            let ga = g.matmul(&y.t()?)?.sum_to_shape(&sa)?;
            let gb = x.t()?.matmul(g)?.sum_to_shape(&sb)?;
            Ok(vec![Some(ga), Some(gb)])
        }))
    }
}
