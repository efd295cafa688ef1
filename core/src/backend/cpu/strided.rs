//! Walking strided layouts efficiently: the innermost dimension is a run with one stride, the
//! outer dimensions are enumerated once per run, and adjacent dimensions that are laid out
//! back-to-back in every operand are merged first, so most views cost one tight loop.

use rayon::prelude::*;

use super::elementwise::PAR_THRESHOLD;
use crate::shape::{Layout, Shape};

/// Merges adjacent dimensions that are contiguous with respect to each other in all `layouts`
/// (which share one shape), returning equivalent layouts of lower rank.
pub fn coalesce(layouts: &[&Layout]) -> Vec<Layout> {
    let shape = layouts[0].dims();
    let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
    let mut strides: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); layouts.len()];
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 && !dims.is_empty() {
            continue;
        }
        let mergeable = !dims.is_empty()
            && layouts.iter().zip(&strides).all(|(l, s)| {
                let prev = *s.last().expect("non-empty");
                prev == l.strides[i] * d
            });
        if mergeable {
            *dims.last_mut().expect("non-empty") *= d;
            for (l, s) in layouts.iter().zip(strides.iter_mut()) {
                *s.last_mut().expect("non-empty") = l.strides[i];
            }
        } else {
            dims.push(d);
            for (l, s) in layouts.iter().zip(strides.iter_mut()) {
                s.push(l.strides[i]);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        strides.iter_mut().for_each(|s| s.push(1));
    }
    layouts
        .iter()
        .zip(strides)
        .map(|(l, strides)| Layout {
            shape: Shape::new(dims.clone()),
            strides,
            offset: l.offset,
        })
        .collect()
}

/// The runs of a (coalesced) layout: the start offset of each innermost row, its length and stride.
pub struct Runs {
    pub starts: Vec<usize>,
    pub len: usize,
    pub stride: usize,
}

pub fn runs(layout: &Layout) -> Runs {
    let rank = layout.shape.rank();
    if rank == 0 {
        return Runs {
            starts: vec![layout.offset],
            len: 1,
            stride: 1,
        };
    }
    let outer = Layout {
        shape: Shape::new(&layout.dims()[..rank - 1]),
        strides: layout.strides[..rank - 1].to_vec(),
        offset: layout.offset,
    };
    Runs {
        starts: outer.offsets().collect(),
        len: layout.dims()[rank - 1],
        stride: layout.strides[rank - 1],
    }
}

/// Copies the elements of `layout` from `src` into `out` in row-major order.
pub fn gather<T: Copy + Send + Sync>(src: &[T], layout: &Layout, out: &mut [T]) {
    if let Some(range) = layout.contiguous_range() {
        out.copy_from_slice(&src[range]);
        return;
    }
    let l = &coalesce(&[layout])[0];
    let r = runs(l);
    let copy_run = |(row, &start): (&mut [T], &usize)| {
        if r.stride == 1 {
            row.copy_from_slice(&src[start..start + r.len]);
        } else {
            for (j, o) in row.iter_mut().enumerate() {
                *o = src[start + j * r.stride];
            }
        }
    };
    // Large copies (a transposed activation made contiguous) are split by runs across threads.
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(r.len.max(1)).zip(&r.starts).for_each(copy_run);
    } else {
        out.chunks_mut(r.len.max(1)).zip(&r.starts).for_each(copy_run);
    }
}

/// Copies the elements of `src_layout` in `src` to the positions of `dst_layout` in `dst`
/// (same shape, different buffers), in row-major order, without a temporary.
pub fn copy<T: Copy + Send + Sync>(src: &[T], src_layout: &Layout, dst: &mut [T], dst_layout: &Layout) {
    if let Some(range) = dst_layout.contiguous_range() {
        gather(src, src_layout, &mut dst[range]);
    } else if let Some(range) = src_layout.contiguous_range() {
        scatter(&src[range], dst_layout, dst);
    } else {
        for (from, to) in src_layout.offsets().zip(dst_layout.offsets()) {
            dst[to] = src[from];
        }
    }
}

/// Writes `values` (row-major) into `dst` at the positions of `layout`.
pub fn scatter<T: Copy>(values: &[T], layout: &Layout, dst: &mut [T]) {
    if let Some(range) = layout.contiguous_range() {
        dst[range].copy_from_slice(values);
        return;
    }
    let l = &coalesce(&[layout])[0];
    let r = runs(l);
    for (row, &start) in values.chunks(r.len.max(1)).zip(&r.starts) {
        for (j, &v) in row.iter().enumerate() {
            dst[start + j * r.stride] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pairing of contiguous and transposed sides moves element (i, j) of the source's
    /// view to element (i, j) of the destination's.
    #[test]
    fn copy_matches_element_by_element() {
        let src: Vec<u32> = (0..12).collect();
        let plain = Layout::contiguous([3, 4]);
        let turned = Layout::contiguous([4, 3]).permute(&[1, 0]);
        for (from, to) in [(&plain, &turned), (&turned, &plain), (&turned, &turned)] {
            let mut dst = vec![99; 12];
            copy(&src, from, &mut dst, to);
            for (a, b) in from.offsets().zip(to.offsets()) {
                assert_eq!(dst[b], src[a], "{from:?} -> {to:?}");
            }
        }
    }
}
