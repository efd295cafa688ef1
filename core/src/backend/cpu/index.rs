//! index_select / index_add and gather / scatter_add over `[outer, dim, inner]` views.

use super::pool::Pool;
use crate::error::{Error, Result};

/// An error naming the first index not below `dim`.
pub(super) fn check(op: &'static str, ids: &[u32], dim: usize) -> Result<()> {
    match ids.iter().find(|&&i| i as usize >= dim) {
        // Negative i64 labels arrive as u32::MAX (see `Tensor::as_indices`).
        Some(&u32::MAX) => Err(Error::invalid(
            op,
            format!("a negative index (e.g. label -1) is out of range for a dimension of size {dim}"),
        )),
        Some(bad) => Err(Error::invalid(
            op,
            format!("index {bad} is out of range for a dimension of size {dim}"),
        )),
        None => Ok(()),
    }
}

pub fn index_select<T: Copy + crate::dtype::Element>(
    pool: &Pool,
    src: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    ids: &[u32],
) -> Result<Vec<T>> {
    check("index_select", ids, dim)?;
    let mut out = pool.take::<T>(outer * ids.len() * inner);
    for o in 0..outer {
        for (j, &id) in ids.iter().enumerate() {
            let from = (o * dim + id as usize) * inner;
            let to = (o * ids.len() + j) * inner;
            out[to..to + inner].copy_from_slice(&src[from..from + inner]);
        }
    }
    Ok(out)
}

pub fn index_add<T: Copy + std::ops::AddAssign>(
    dst: &mut [T],
    dst_dim: usize,
    src: &[T],
    outer: usize,
    src_dim: usize,
    inner: usize,
    ids: &[u32],
) -> Result<()> {
    check("index_add", ids, dst_dim)?;
    for o in 0..outer {
        for (j, &id) in ids.iter().enumerate().take(src_dim) {
            let to = (o * dst_dim + id as usize) * inner;
            let from = (o * src_dim + j) * inner;
            dst[to..to + inner]
                .iter_mut()
                .zip(&src[from..from + inner])
                .for_each(|(d, &s)| *d += s);
        }
    }
    Ok(())
}

pub fn gather<T: Copy + crate::dtype::Element>(
    pool: &Pool,
    src: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    ids: &[u32],
    out_dim: usize,
) -> Result<Vec<T>> {
    check("gather", ids, dim)?;
    let mut out = pool.take::<T>(outer * out_dim * inner);
    for o in 0..outer {
        for j in 0..out_dim {
            for i in 0..inner {
                let at = (o * out_dim + j) * inner + i;
                out[at] = src[(o * dim + ids[at] as usize) * inner + i];
            }
        }
    }
    Ok(out)
}

pub fn scatter_add<T: Copy + std::ops::AddAssign>(
    dst: &mut [T],
    dst_dim: usize,
    src: &[T],
    outer: usize,
    src_dim: usize,
    inner: usize,
    ids: &[u32],
) -> Result<()> {
    check("scatter_add", ids, dst_dim)?;
    for o in 0..outer {
        for j in 0..src_dim {
            for i in 0..inner {
                let at = (o * src_dim + j) * inner + i;
                dst[(o * dst_dim + ids[at] as usize) * inner + i] += src[at];
            }
        }
    }
    Ok(())
}
