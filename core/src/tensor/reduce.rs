//! Sum, mean, max, min and argmax over axes.

use super::Tensor;
use crate::backend::ReduceKind;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;

impl Tensor {
    fn resolve_axes(&self, op: &'static str, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = axes
            .iter()
            .map(|&a| self.shape().axis(op, a))
            .collect::<Result<Vec<_>>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn reduce_raw(&self, kind: ReduceKind, axes: &[usize]) -> Result<Tensor> {
        self.float_only(kind.name())?;
        let buffer = self.backend().reduce(kind, self.buffer(), self.layout(), axes)?;
        let dims: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        Ok(Tensor::from_buffer(buffer, dims, self.device()))
    }

    fn drop_axes(&self, axes: &[usize], keepdim: bool) -> Result<Tensor> {
        if keepdim {
            return Ok(self.clone());
        }
        let dims: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        self.reshape(dims)
    }

    /// Sum over resolved axes, keeping them as size 1.
    pub(crate) fn sum_keepdim(&self, axes: &[usize]) -> Result<Tensor> {
        if crate::autocast::active().is_some() && matches!(self.dtype(), DType::F16 | DType::BF16) {
            // Sums accumulate in f32 under autocast (PyTorch runs them with dtype=float32).
            return crate::autocast::full(self)?.sum_keepdim(axes);
        }
        let out = self.reduce_raw(ReduceKind::Sum, axes)?;
        let shape = self.shape().clone();
        Ok(out.track("sum", &[self], move |g| Ok(vec![Some(g.broadcast_as(&shape)?)])))
    }

    /// Sum over `axes` (negative counts from the end).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let axes = self.resolve_axes("sum", axes)?;
        self.sum_keepdim(&axes)?.drop_axes(&axes, keepdim)
    }
    /// Sum of every element, as a scalar tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        let axes: Vec<usize> = (0..self.rank()).collect();
        self.sum_keepdim(&axes)?.reshape(Shape::scalar())
    }
    /// Mean over `axes` (negative counts from the end), as `torch.mean(dim, keepdim)`.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let resolved = self.resolve_axes("mean", axes)?;
        let count: usize = resolved.iter().map(|&a| self.dims()[a]).product();
        // Over nothing the mean is 0/0 = NaN, as in PyTorch.
        self.sum(axes, keepdim)?.affine(1.0 / count as f64, 0.0)
    }
    /// Mean of every element, as a scalar tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.sum_all()?.affine(1.0 / self.elem_count() as f64, 0.0)
    }

    fn extremum(&self, kind: ReduceKind, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.shape().axis(kind.name(), axis)?;
        if self.dims()[a] == 0 {
            return Err(Error::invalid(
                kind.name(),
                format!("cannot reduce an empty axis {a} of shape {}", self.shape()),
            ));
        }
        let out = self.reduce_raw(kind, &[a])?;
        let x = self.detach();
        let reduced = out.detach();
        let out = out.track(kind.name(), &[self], move |g| {
            // The gradient goes to the first extremal element, as in PyTorch's max(dim).
            let hits = x.eq(&reduced)?.to_dtype(x.dtype())?;
            let first = hits.reduce_raw(ReduceKind::ArgMax, &[a])?;
            let mut along = vec![1; x.rank()];
            along[a] = x.dims()[a];
            let positions = Tensor::arange(0, x.dims()[a] as i64, DType::U32, x.device())?.reshape(along)?;
            Ok(vec![Some(positions.eq(&first)?.to_dtype(x.dtype())?.mul(g)?)])
        });
        out.drop_axes(&[a], keepdim)
    }

    /// Maximum along `axis`, as the values of `torch.max(dim, keepdim)`; the gradient goes to the first maximum.
    pub fn max(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum(ReduceKind::Max, axis, keepdim)
    }
    /// Minimum along `axis`, as the values of `torch.min(dim, keepdim)`; the gradient goes to the first minimum.
    pub fn min(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.extremum(ReduceKind::Min, axis, keepdim)
    }
    /// Index of the first maximum along `axis`, as U32.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = self.shape().axis("argmax", axis)?;
        if self.dims()[a] == 0 {
            return Err(Error::invalid(
                "argmax",
                format!("cannot reduce an empty axis {a} of shape {}", self.shape()),
            ));
        }
        self.reduce_raw(ReduceKind::ArgMax, &[a])?.drop_axes(&[a], keepdim)
    }
}
