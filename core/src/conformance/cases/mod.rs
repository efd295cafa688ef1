//! Every conformance case, grouped like the `Backend` trait.

mod buffers;
mod cross_entropy;
mod elementwise;
mod linalg;
mod nn;
mod optim;
mod optim_multi;
mod reduce;
mod shape;
mod special;
mod transformer;

use super::case::Case;

pub fn all() -> Vec<Case> {
    let mut all = buffers::cases();
    all.extend(elementwise::cases());
    all.extend(reduce::cases());
    all.extend(shape::cases());
    all.extend(linalg::cases());
    all.extend(nn::cases());
    all.extend(cross_entropy::cases());
    all.extend(optim::cases());
    all.extend(optim_multi::cases());
    all.extend(special::cases());
    all.extend(transformer::cases());
    all
}
