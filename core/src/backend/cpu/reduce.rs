//! Sum, max, min and argmax over any set of axes, keeping them as size 1.

use rayon::prelude::*;

use super::pool::Pool;
use crate::backend::ReduceKind;
use crate::dtype::Element;
use crate::shape::{Layout, Shape};

/// Splits `layout` into the kept axes (outer) and the reduced axes (inner).
fn split(layout: &Layout, axes: &[usize]) -> (Layout, Layout) {
    let pick = |keep: bool| {
        let idx: Vec<usize> = (0..layout.shape.rank()).filter(|a| axes.contains(a) != keep).collect();
        Layout { shape: Shape::new(idx.iter().map(|&a| layout.dims()[a]).collect::<Vec<_>>()), strides: idx.iter().map(|&a| layout.strides[a]).collect(), offset: layout.offset }
    };
    (pick(true), pick(false))
}

/// Reduces floats accumulating in `T` (f32 kernels accumulate in f32, as PyTorch's CPU does).
pub fn reduce<T: Element + num_traits::Float>(pool: &Pool, kind: ReduceKind, src: &[T], layout: &Layout, axes: &[usize]) -> Vec<T> {
    let (kept, reduced) = split(layout, axes);
    let combine = move |acc: T, x: T| match kind {
        ReduceKind::Sum => acc + x,
        ReduceKind::Max => if x > acc || x.is_nan() { x } else { acc },
        ReduceKind::Min => if x < acc || x.is_nan() { x } else { acc },
        ReduceKind::ArgMax => unreachable!("argmax has its own kernel"),
    };
    let init = match kind {
        ReduceKind::Sum => T::zero(),
        ReduceKind::Max => T::neg_infinity(),
        _ => T::infinity(),
    };
    let n_out = kept.elem_count();
    let mut out = pool.take::<T>(n_out);
    // Fast path 1: contiguous input reduced over trailing axes: one slice per output.
    if let (Some(range), true) = (layout.contiguous_range(), axes.iter().enumerate().all(|(i, &a)| a == layout.shape.rank() - axes.len() + i)) {
        let inner = reduced.elem_count();
        if inner == 0 {
            out.fill(init);
            return out;
        }
        let src = &src[range];
        let body = |(o, chunk): (&mut T, &[T])| *o = chunk.iter().fold(init, |a, &x| combine(a, x));
        if src.len() >= super::elementwise::PAR_THRESHOLD {
            out.par_iter_mut().zip(src.par_chunks(inner)).for_each(body);
        } else {
            out.iter_mut().zip(src.chunks(inner)).for_each(body);
        }
        return out;
    }
    // Fast path 2: contiguous input reduced over leading axes: accumulate whole rows.
    if let (Some(range), true) = (layout.contiguous_range(), axes.iter().enumerate().all(|(i, &a)| a == i)) {
        out.fill(init);
        for row in src[range].chunks(n_out.max(1)) {
            out.iter_mut().zip(row).for_each(|(o, &x)| *o = combine(*o, x));
        }
        return out;
    }
    for (o, base) in out.iter_mut().zip(kept.offsets()) {
        let inner = Layout { offset: base, ..reduced.clone() };
        *o = inner.offsets().fold(init, |a, i| combine(a, src[i]));
    }
    out
}

/// Index of the first maximum along one axis (NaN counts as the maximum, as in PyTorch).
pub fn argmax<T: Element + num_traits::Float>(pool: &Pool, src: &[T], layout: &Layout, axis: usize) -> Vec<u32> {
    let (kept, reduced) = split(layout, &[axis]);
    let mut out = pool.take::<u32>(kept.elem_count());
    for (o, base) in out.iter_mut().zip(kept.offsets()) {
        let inner = Layout { offset: base, ..reduced.clone() };
        let mut best = (0u32, T::neg_infinity());
        for (j, i) in inner.offsets().enumerate() {
            let x = src[i];
            if j == 0 || x > best.1 || (x.is_nan() && !best.1.is_nan()) {
                best = (j as u32, x);
            }
        }
        *o = best.0;
    }
    out
}
