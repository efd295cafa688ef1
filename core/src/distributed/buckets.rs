//! Gradient buckets: which parameters share one flat buffer, and that buffer. Assignment
//! follows PyTorch's `compute_bucket_assignment_by_size`: walk the parameters in the order
//! their gradients are expected, close a bucket once it reaches its cap (the first cap for the
//! first bucket, so communication starts early, then the regular cap).

use std::collections::{BTreeMap, HashMap};

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

/// As `assign`, but each bucket holds the parameters of one owner, so ZeRO stage 2 can reduce
/// it to that rank alone: every owner fills a bucket of its own as the walk reaches its
/// parameters. Buckets are listed by when their last parameter comes in the walk (when they
/// fill), which is the order they close in, the partly filled ones last.
pub(super) fn assign_by_owner(
    order: &[usize],
    bytes: impl Fn(usize) -> usize,
    owner: impl Fn(usize) -> usize,
    first_cap: usize,
    cap: usize,
) -> Vec<Vec<usize>> {
    let mut closed: Vec<Vec<usize>> = Vec::new();
    let mut open: BTreeMap<usize, (Vec<usize>, usize)> = BTreeMap::new();
    for &i in order {
        let (members, filled) = open.entry(owner(i)).or_default();
        members.push(i);
        *filled += bytes(i);
        let limit = if closed.is_empty() { first_cap } else { cap };
        if *filled >= limit {
            closed.push(std::mem::take(members));
            *filled = 0;
        }
    }
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(at, &i)| (i, at)).collect();
    let mut rest: Vec<Vec<usize>> = open.into_values().map(|(m, _)| m).filter(|m| !m.is_empty()).collect();
    rest.sort_by_key(|m| m.last().map(|i| position[i]));
    closed.extend(rest);
    closed
}

/// A parameter's place in its bucket.
pub(super) struct Slot {
    /// Index of the parameter in registration order.
    pub param: usize,
    pub offset: usize,
}

pub(super) struct Bucket {
    /// The gradients of its parameters, flat, on their device: kept for the run (data
    /// parallel), or, where the bucket has an `owner`, made when its first gradient comes in and
    /// let go once reduced (ZeRO stage 2: a rank holds no lasting copy of others' gradients).
    pub flat: Option<Tensor>,
    pub slots: Vec<Slot>,
    /// Gradients copied in during this backward pass.
    pub ready: usize,
    /// ZeRO stage 2: the rank that steps these parameters, the only one the bucket is reduced to.
    pub owner: Option<usize>,
    elements: usize,
}

impl Bucket {
    pub fn new(members: &[usize], params: &[Tensor], owner: Option<usize>) -> Result<Bucket> {
        let mut offset = 0;
        let slots = members
            .iter()
            .map(|&param| {
                let slot = Slot { param, offset };
                offset += params[param].elem_count();
                slot
            })
            .collect();
        let mut bucket = Bucket {
            flat: None,
            slots,
            ready: 0,
            owner,
            elements: offset,
        };
        if owner.is_none() {
            bucket.storage(&params[members[0]])?;
        }
        Ok(bucket)
    }

    /// The flat buffer, made (like `param`, zeroed) where there is none yet.
    pub fn storage(&mut self, param: &Tensor) -> Result<&Tensor> {
        if self.flat.is_none() {
            self.flat = Some(Tensor::zeros([self.elements], param.dtype(), param.device())?);
        }
        Ok(self.flat.as_ref().expect("made above"))
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
    use super::{assign, assign_by_owner};

    #[test]
    fn the_first_bucket_closes_at_the_first_cap_and_the_rest_at_the_regular_cap() {
        let sizes = [4, 4, 4, 4, 4, 4, 20, 4];
        let order: Vec<usize> = (0..sizes.len()).collect();
        let buckets = assign(&order, |i| sizes[i], 8, 12);
        assert_eq!(buckets, vec![vec![0, 1], vec![2, 3, 4], vec![5, 6], vec![7]]);
    }

    #[test]
    fn owners_fill_buckets_of_their_own_listed_as_they_fill() {
        // Parameters 0..8 in the walk's order, owned alternately by ranks 0 and 1, 4 bytes each.
        let order: Vec<usize> = (0..8).collect();
        let owner = |i: usize| i % 2;
        let buckets = assign_by_owner(&order, |_| 4, owner, 8, 12);
        // Rank 0's first two close the first bucket (first cap 8), rank 1's fill the next at 12
        // bytes; the partly filled ones follow, by when their last parameter comes.
        assert_eq!(buckets, vec![vec![0, 2], vec![1, 3, 5], vec![4, 6], vec![7]]);
        for b in &buckets {
            assert!(b.iter().all(|&i| owner(i) == owner(b[0])), "{b:?}");
        }
    }

    #[test]
    fn with_one_owner_buckets_are_as_plain_assignment() {
        let sizes = [4, 4, 4, 4, 4, 4, 20, 4];
        let order: Vec<usize> = (0..sizes.len()).rev().collect();
        assert_eq!(
            assign_by_owner(&order, |i| sizes[i], |_| 3, 8, 12),
            assign(&order, |i| sizes[i], 8, 12)
        );
    }

    #[test]
    fn buckets_follow_the_order_given() {
        let buckets = assign(&[3, 1, 2, 0], |_| 4, 8, 8);
        assert_eq!(buckets, vec![vec![3, 1], vec![2, 0]]);
    }
}
