//! Loading a state dict into a module: strict name and shape matching, as PyTorch's
//! `load_state_dict(strict=True)`, with one error that lists every problem at once.

use std::collections::{HashMap, HashSet};

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What is wrong with a state dict, collected before anything is written.
#[derive(Default)]
struct Problems {
    missing: Vec<String>,
    unexpected: Vec<String>,
    duplicate: Vec<String>,
    shape: Vec<String>,
}

impl Problems {
    fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.duplicate.is_empty() && self.shape.is_empty()
    }
    /// `missing: a, b; unexpected: c; shape mismatch: d expected [2] got [3]`.
    fn report(&self) -> String {
        [
            ("missing", &self.missing),
            ("unexpected", &self.unexpected),
            ("duplicate", &self.duplicate),
            ("shape mismatch", &self.shape),
        ]
        .iter()
        .filter(|(_, items)| !items.is_empty())
        .map(|(what, items)| format!("{what}: {}", items.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
    }
}

/// Copies `given` into `own` (a module's state dict, whose tensors share the module's storage).
pub(super) fn load(own: &[(String, Tensor)], given: &[(String, Tensor)]) -> Result<()> {
    copy_checked(own, given, true)
}

/// Copies `given`, whose names are all among `own`'s, leaving `own`'s other tensors as they are
/// (a non-strict load); shapes must still agree.
pub(super) fn load_subset(own: &[(String, Tensor)], given: &[(String, Tensor)]) -> Result<()> {
    copy_checked(own, given, false)
}

/// Checks names (every one of `own` present when `whole`) and shapes, then copies.
fn copy_checked(own: &[(String, Tensor)], given: &[(String, Tensor)], whole: bool) -> Result<()> {
    let mut problems = Problems::default();
    let mut by_name: HashMap<&str, &Tensor> = HashMap::with_capacity(given.len());
    for (name, t) in given {
        if by_name.insert(name, t).is_some() {
            problems.duplicate.push(name.clone());
        }
    }
    let mut copies = Vec::with_capacity(own.len());
    for (name, dst) in own {
        match by_name.get(name.as_str()) {
            None if whole => problems.missing.push(name.clone()),
            None => {}
            Some(src) if src.shape() != dst.shape() => {
                problems
                    .shape
                    .push(format!("{name} expected {} got {}", dst.shape(), src.shape()))
            }
            Some(src) => copies.push((dst, *src)),
        }
    }
    let known: HashSet<&str> = own.iter().map(|(n, _)| n.as_str()).collect();
    problems.unexpected = given
        .iter()
        .filter(|(n, _)| !known.contains(n.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    if !problems.is_empty() {
        return Err(Error::invalid("load_state_dict", problems.report()));
    }
    // Conversions must not join the source's graph: this is a copy, not a computation.
    no_grad(|| {
        copies
            .iter()
            .try_for_each(|(dst, src)| dst.assign(&src.to_device(dst.device())?.to_dtype(dst.dtype())?))
    })
}
