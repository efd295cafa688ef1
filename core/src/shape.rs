//! Shapes, and layouts (shape + strides + offset) that let views share storage.

use std::fmt;

use crate::error::{Error, Result};

/// The sizes of a tensor's dimensions, outermost first (as `torch.Size`); rank 0 is a scalar.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape with these dimension sizes, outermost first.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    /// The rank-0 shape of a scalar (one element).
    pub fn scalar() -> Self {
        Shape(vec![])
    }
    /// The dimension sizes, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements: the product of the dimensions (1 for a scalar, 0 if any dimension is 0).
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }
    /// Row-major strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.0.len()];
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc *= d;
        }
        strides
    }
    /// Resolves a possibly negative axis (as in PyTorch: -1 is the last) against this rank.
    pub fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        let rank = self.rank() as isize;
        let resolved = if axis < 0 { axis + rank } else { axis };
        if resolved < 0 || resolved >= rank.max(1) || (rank == 0 && resolved != 0) {
            return Err(Error::invalid(
                op,
                format!("axis {axis} is out of range for shape {self}"),
            ));
        }
        Ok(resolved as usize)
    }
    /// The shape both operands broadcast to (NumPy/PyTorch rules).
    pub fn broadcast(op: &'static str, a: &Shape, b: &Shape) -> Result<Shape> {
        let rank = a.rank().max(b.rank());
        let mut out = vec![0; rank];
        #[allow(clippy::needless_range_loop)] // `i` aligns both operands from the right
        for i in 0..rank {
            let da = if i + a.rank() >= rank {
                a.0[i + a.rank() - rank]
            } else {
                1
            };
            let db = if i + b.rank() >= rank {
                b.0[i + b.rank() - rank]
            } else {
                1
            };
            out[i] = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => {
                    return Err(Error::shape(
                        op,
                        a,
                        b,
                        format!("dimension {i} is {da} vs {db} and neither is 1"),
                    ));
                }
            };
        }
        Ok(Shape(out))
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Where a tensor's elements live in its buffer: element `[i, j, ..]` is at
/// `offset + i*strides[0] + j*strides[1] + ..`. Stride 0 is a broadcast dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The logical shape of the view, independent of how its elements are laid out.
    pub shape: Shape,
    /// Buffer elements (not bytes) to step per index of each dimension; 0 repeats a broadcast value.
    pub strides: Vec<usize>,
    /// Buffer index, in elements, of the first element.
    pub offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` starting at buffer index 0.
    pub fn contiguous(shape: impl Into<Shape>) -> Self {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }
    /// The view's dimension sizes (`shape.dims()`).
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    /// Number of elements in the view (not the buffer's length).
    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }
    /// True when the elements are in row-major order with no gaps (the offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.dims().iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }
    /// The `[start, end)` element range of a contiguous layout.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.elem_count())
    }
    /// Buffer offsets of every element in row-major order.
    pub fn offsets(&self) -> StridedOffsets<'_> {
        StridedOffsets::new(self)
    }
    /// The same elements with dimensions reordered (dimension `i` of the result is `perm[i]` of this one),
    /// as `torch.permute`; no data moves.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: Shape(perm.iter().map(|&p| self.shape.0[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }
    /// The layout seen with `shape`, repeating size-1 or missing leading dimensions (stride 0).
    pub fn broadcast_to(&self, op: &'static str, shape: &Shape) -> Result<Layout> {
        let rank = shape.rank();
        if self.shape.rank() > rank {
            return Err(Error::shape(op, &self.shape, shape, "cannot broadcast to a lower rank"));
        }
        let lead = rank - self.shape.rank();
        let mut strides = vec![0; rank];
        for i in 0..self.shape.rank() {
            let (d, target) = (self.shape.0[i], shape.0[lead + i]);
            strides[lead + i] = if d == target {
                self.strides[i]
            } else if d == 1 {
                0
            } else {
                return Err(Error::shape(
                    op,
                    &self.shape,
                    shape,
                    format!("dimension {i} cannot broadcast"),
                ));
            };
        }
        Ok(Layout {
            shape: shape.clone(),
            strides,
            offset: self.offset,
        })
    }
    /// The largest buffer index this layout touches, plus one (0 when empty).
    pub fn extent(&self) -> usize {
        if self.elem_count() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .0
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }
}

/// Layouts of one shape seen through as few dimensions as give the same offsets: size-1
/// dimensions dropped, and neighbours `d, d + 1` merged where every operand steps across them as
/// one (`stride[d] == stride[d + 1] * dim[d + 1]`). A contiguous operand's view becomes one
/// dimension. For GPU kernels, which find a strided operand's element by dividing its flat index
/// by each dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedDims {
    /// The merged dimension sizes (none for a single element).
    pub dims: Vec<usize>,
    /// Each operand's strides over `dims`, in the order the layouts were given.
    pub strides: Vec<Vec<usize>>,
}

impl MergedDims {
    /// `layouts` must share one shape (broadcast them first).
    pub fn new(layouts: &[&Layout]) -> MergedDims {
        let dims_in = layouts.first().map_or(&[][..], |l| l.dims());
        debug_assert!(layouts.iter().all(|l| l.dims() == dims_in), "layouts of one shape");
        // (size, each operand's stride) of every merged dimension.
        let mut merged: Vec<(usize, Vec<usize>)> = Vec::new();
        for (d, &size) in dims_in.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let strides: Vec<usize> = layouts.iter().map(|l| l.strides[d]).collect();
            if let Some((last_size, last_strides)) = merged.last_mut()
                && last_strides
                    .iter()
                    .zip(&strides)
                    .all(|(&outer, &inner)| outer == inner * size)
            {
                *last_size *= size;
                *last_strides = strides;
            } else {
                merged.push((size, strides));
            }
        }
        let dims = merged.iter().map(|(size, _)| *size).collect();
        let strides = (0..layouts.len())
            .map(|k| merged.iter().map(|(_, strides)| strides[k]).collect())
            .collect();
        MergedDims { dims, strides }
    }
}

/// Iterator over the buffer offsets of a strided layout, in row-major element order.
pub struct StridedOffsets<'a> {
    layout: &'a Layout,
    index: Vec<usize>,
    next: Option<usize>,
}

impl<'a> StridedOffsets<'a> {
    fn new(layout: &'a Layout) -> Self {
        let next = (layout.elem_count() > 0).then_some(layout.offset);
        StridedOffsets {
            layout,
            index: vec![0; layout.shape.rank()],
            next,
        }
    }
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        let dims = self.layout.shape.dims();
        let mut off = current;
        let mut d = dims.len();
        loop {
            if d == 0 {
                self.next = None;
                break;
            }
            d -= 1;
            self.index[d] += 1;
            off += self.layout.strides[d];
            if self.index[d] < dims[d] {
                self.next = Some(off);
                break;
            }
            off -= self.layout.strides[d] * self.index[d];
            self.index[d] = 0;
        }
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy_rules() {
        let s = Shape::broadcast("t", &Shape::new([3, 1, 5]), &Shape::new([4, 1])).unwrap();
        assert_eq!(s.dims(), &[3, 4, 5]);
        let err = Shape::broadcast("add", &Shape::new([3, 2]), &Shape::new([4, 2])).unwrap_err();
        assert!(
            err.to_string().contains("[3, 2]") && err.to_string().contains("[4, 2]"),
            "{err}"
        );
    }

    /// Operand `k`'s offset of flat element `i` through merged dimensions, as a kernel finds it.
    fn merged_offset(m: &MergedDims, layout: &Layout, k: usize, mut i: usize) -> usize {
        let mut at = layout.offset;
        for (&size, &stride) in m.dims.iter().zip(&m.strides[k]).rev() {
            at += (i % size) * stride;
            i /= size;
        }
        at
    }

    #[test]
    fn merged_dimensions_give_every_operand_the_same_offsets() {
        let nchw = Layout::contiguous([4, 3, 5, 6]);
        let bias = Layout::contiguous([1, 3, 1, 1])
            .broadcast_to("t", &Shape::new([4, 3, 5, 6]))
            .unwrap();
        let mut sliced = Layout::contiguous([4, 3, 5, 8]);
        sliced.shape = Shape::new([4, 3, 5, 6]);
        sliced.offset = 2;
        let nhwc = Layout::contiguous([4, 5, 6, 3]).permute(&[0, 3, 1, 2]);
        let cases: Vec<(Vec<&Layout>, Vec<usize>)> = vec![
            (vec![&nchw], vec![360]),
            (vec![&nchw, &nchw], vec![360]),
            (vec![&nchw, &bias], vec![4, 3, 30]),
            (vec![&sliced], vec![60, 6]),
            (vec![&nchw, &nhwc], vec![4, 3, 30]),
        ];
        for (layouts, expected) in cases {
            let m = MergedDims::new(&layouts);
            assert_eq!(m.dims, expected, "{layouts:?}");
            assert_eq!(m.dims.iter().product::<usize>(), layouts[0].elem_count());
            for (k, layout) in layouts.iter().enumerate() {
                let through_merged: Vec<usize> = (0..layout.elem_count())
                    .map(|i| merged_offset(&m, layout, k, i))
                    .collect();
                assert_eq!(through_merged, layout.offsets().collect::<Vec<_>>(), "{layout:?}");
            }
        }
        // Size-1 dimensions vanish; one element has none left, an empty tensor keeps its 0.
        let one = Layout::contiguous([1, 1]);
        assert_eq!(MergedDims::new(&[&one]).dims, Vec::<usize>::new());
        let empty = Layout::contiguous([2, 0, 3]);
        assert_eq!(MergedDims::new(&[&empty]).dims.iter().product::<usize>(), 0);
    }

    #[test]
    fn strided_offsets_walk_a_transpose() {
        let l = Layout::contiguous([2, 3]).permute(&[1, 0]);
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
        let b = Layout::contiguous([3]).broadcast_to("t", &Shape::new([2, 3])).unwrap();
        assert_eq!(b.offsets().collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(Layout::contiguous([0, 3]).offsets().count(), 0);
    }
}
