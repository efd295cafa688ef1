//! A node's gradient while the walk is still delivering it: whole, or the pieces that narrow views
//! of the node's output sent back. Splitting a tensor into views (attention's q, k and v out of
//! one projection) would otherwise pad each view's gradient with zeros to the full shape and add
//! the padded tensors; kept as pieces, views that tile an axis are joined with one copy, as
//! PyTorch's `split` backward is a `cat`.

use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Where a narrow view sits in its source: `shape` is the source's, the view covers
/// `start..start + len` of `axis`.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub shape: Shape,
    pub axis: usize,
    pub start: usize,
}

/// The gradient delivered to a node so far.
pub(super) enum Pending {
    Whole(Tensor),
    /// Gradients of narrow views along one axis of a source of one shape, in arrival order.
    Pieces {
        shape: Shape,
        axis: usize,
        pieces: Vec<(usize, Tensor)>,
    },
}

impl Pending {
    /// `prev` (what had arrived, if anything) plus a whole gradient.
    pub(super) fn add_whole(prev: Option<Pending>, grad: Tensor) -> Result<Pending> {
        Ok(Pending::Whole(match prev {
            Some(prev) => prev.into_tensor()?.add(&grad)?,
            None => grad,
        }))
    }

    /// `prev` plus a view's gradient: kept as a piece when nothing had arrived, or pieces along
    /// the same axis of the same source shape.
    pub(super) fn add_piece(prev: Option<Pending>, window: &Window, grad: Tensor) -> Result<Pending> {
        match prev {
            None => Ok(Pending::Pieces {
                shape: window.shape.clone(),
                axis: window.axis,
                pieces: vec![(window.start, grad)],
            }),
            Some(Pending::Pieces {
                shape,
                axis,
                mut pieces,
            }) if shape == window.shape && axis == window.axis => {
                pieces.push((window.start, grad));
                Ok(Pending::Pieces { shape, axis, pieces })
            }
            other => Pending::add_whole(other, grad.pad_into(&window.shape, window.axis, window.start)?),
        }
    }

    /// The gradient as one tensor of the node's shape.
    pub(super) fn into_tensor(self) -> Result<Tensor> {
        let (shape, axis, mut pieces) = match self {
            Pending::Whole(grad) => return Ok(grad),
            Pending::Pieces { shape, axis, pieces } => (shape, axis, pieces),
        };
        if pieces.len() > 1 && tiles(&shape, axis, &mut pieces) {
            let parts: Vec<&Tensor> = pieces.iter().map(|(_, g)| g).collect();
            return Tensor::concat(&parts, axis as isize);
        }
        // Overlapping or gapped views (or one): pad each and add them, in arrival order.
        let mut padded = pieces.into_iter().map(|(start, g)| g.pad_into(&shape, axis, start));
        let mut sum = padded
            .next()
            .ok_or_else(|| Error::Autograd("a view's gradient was lost on its way back".into()))??;
        for p in padded {
            sum = sum.add(&p?)?;
        }
        Ok(sum)
    }
}

/// Whether `pieces` of one dtype, put in order of their start, cover `axis` of `shape` exactly
/// once (and leaves them in that order).
fn tiles(shape: &Shape, axis: usize, pieces: &mut [(usize, Tensor)]) -> bool {
    pieces.sort_by_key(|(start, _)| *start);
    let dtype = pieces[0].1.dtype();
    let mut end = 0;
    for (start, grad) in pieces.iter() {
        if *start != end || grad.dtype() != dtype {
            return false;
        }
        end += grad.dims()[axis];
    }
    end == shape.dims()[axis]
}
