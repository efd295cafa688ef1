//! Gradient buckets: which parameters share one flat buffer, and that buffer. Assignment
//! follows PyTorch's `compute_bucket_assignment_by_size`: walk the parameters in the order
//! their gradients are expected, close a bucket once it reaches its cap (the first cap for the
//! first bucket, so communication starts early, then the regular cap).

use crate::error::Result;
use crate::shape::Layout;
use crate::tensor::Tensor;

/// Groups parameter indices (in the order given) into buckets of at most `first_cap` bytes for
/// the first and `cap` for the others; a bucket can exceed its cap by one parameter, and a
/// parameter larger than the cap gets a bucket of its own.
pub(super) fn assign(order: &[usize], bytes: impl Fn(usize) -> usize, first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current = Vec::new();
    let mut filled = 0;
    for &i in order {
        current.push(i);
        filled += bytes(i);
        let limit = if buckets.is_empty() { first_cap } else { cap };
        if filled >= limit {
            buckets.push(std::mem::take(&mut current));
            filled = 0;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// A parameter's place in its bucket.
pub(super) struct Slot {
    /// Index of the parameter in registration order.
    pub param: usize,
    pub offset: usize,
}

pub(super) struct Bucket {
    /// The gradients of its parameters, flat, on their device.
    pub flat: Tensor,
    pub slots: Vec<Slot>,
    /// Gradients copied in during this backward pass.
    pub ready: usize,
}

impl Bucket {
    pub fn new(members: &[usize], params: &[Tensor]) -> Result<Bucket> {
        let first = &params[members[0]];
        let total: usize = members.iter().map(|&i| params[i].elem_count()).sum();
        let flat = Tensor::zeros([total], first.dtype(), first.device())?;
        let mut offset = 0;
        let slots = members
            .iter()
            .map(|&param| {
                let slot = Slot { param, offset };
                offset += params[param].elem_count();
                slot
            })
            .collect();
        Ok(Bucket { flat, slots, ready: 0 })
    }

    pub fn is_full(&self) -> bool {
        self.ready == self.slots.len()
    }

    /// Where `param` (of slot `s`) lives inside the flat buffer.
    pub fn view_of(&self, s: usize, param: &Tensor) -> Layout {
        Layout {
            shape: param.shape().clone(),
            strides: param.shape().contiguous_strides(),
            offset: self.slots[s].offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::assign;

    #[test]
    fn the_first_bucket_closes_at_the_first_cap_and_the_rest_at_the_regular_cap() {
        let sizes = [4, 4, 4, 4, 4, 4, 20, 4];
        let order: Vec<usize> = (0..sizes.len()).collect();
        let buckets = assign(&order, |i| sizes[i], 8, 12);
        assert_eq!(buckets, vec![vec![0, 1], vec![2, 3, 4], vec![5, 6], vec![7]]);
    }

    #[test]
    fn buckets_follow_the_order_given() {
        let buckets = assign(&[3, 1, 2, 0], |_| 4, 8, 8);
        assert_eq!(buckets, vec![vec![3, 1], vec![2, 0]]);
    }
}
