//! Gradients through narrow views of one tensor: views that tile an axis are joined into one
//! gradient, views with gaps or overlaps are padded and summed, and a tensor used both whole and
//! through views gets both. Each checked against the gradient written out by hand.

use lockstep_core::{Device, Tensor};

/// A `[6, 4]` leaf and `x = 2·leaf`, so the views below are of a recorded op's output (the
/// walk's path for views of a node, not of a leaf).
fn source() -> (Tensor, Tensor) {
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
    let leaf = Tensor::from_slice(&values, [6, 4], &Device::cpu())
        .unwrap()
        .requires_grad(true);
    let x = leaf.mul(&constant(2.0)).unwrap();
    (leaf, x)
}

/// A scalar that needs no gradient.
fn constant(value: f32) -> Tensor {
    Tensor::from_slice(&[value], [1], &Device::cpu()).unwrap()
}

/// `sum(view · w)`. (By multiplication, not `affine`, whose backward adds 0 and so would turn
/// a gradient of -0 into +0.)
fn weighted(view: &Tensor, w: f32) -> Tensor {
    view.mul(&constant(w)).unwrap().sum_all().unwrap()
}

/// The leaf's gradient after `loss.backward()`.
fn gradient(leaf: &Tensor, loss: Tensor) -> Vec<f32> {
    loss.backward().unwrap();
    leaf.grad().unwrap().to_vec::<f32>().unwrap()
}

/// Row `r` of the expected `[6, 4]` gradient is `2 · rows[r]` (`x`'s factor 2).
fn by_rows(rows: [f32; 6]) -> Vec<f32> {
    rows.iter().flat_map(|&r| [2.0 * r; 4]).collect()
}

#[test]
fn views_that_tile_an_axis_get_their_gradients_joined_in_place() {
    let (leaf, x) = source();
    // Used out of order, so the pieces arrive out of order.
    let (a, b, c) = (
        x.narrow(0, 0, 2).unwrap(),
        x.narrow(0, 2, 3).unwrap(),
        x.narrow(0, 5, 1).unwrap(),
    );
    let loss = weighted(&c, 3.0)
        .add(&weighted(&a, 1.0))
        .unwrap()
        .add(&weighted(&b, -0.0))
        .unwrap();
    // Joined, not zero-padded and summed: the gradient of -0 keeps its sign (0 + -0 is +0), as
    // after PyTorch's split, whose backward is a cat.
    let bits = |g: Vec<f32>| g.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(gradient(&leaf, loss)),
        bits(by_rows([1.0, 1.0, -0.0, -0.0, -0.0, 3.0]))
    );
}

#[test]
fn views_with_a_gap_leave_zeros_and_overlapping_views_add() {
    let (leaf, x) = source();
    let loss = weighted(&x.narrow(0, 0, 2).unwrap(), 1.0)
        .add(&weighted(&x.narrow(0, 4, 2).unwrap(), 5.0))
        .unwrap();
    assert_eq!(gradient(&leaf, loss), by_rows([1.0, 1.0, 0.0, 0.0, 5.0, 5.0]));

    let (leaf, x) = source();
    let loss = weighted(&x.narrow(0, 0, 4).unwrap(), 1.0)
        .add(&weighted(&x.narrow(0, 2, 4).unwrap(), 10.0))
        .unwrap();
    assert_eq!(gradient(&leaf, loss), by_rows([1.0, 1.0, 11.0, 11.0, 10.0, 10.0]));
}

#[test]
fn a_tensor_used_whole_and_through_views_gets_both_gradients() {
    for whole_first in [true, false] {
        let (leaf, x) = source();
        let whole = weighted(&x, 0.5);
        let views = weighted(&x.narrow(0, 0, 3).unwrap(), 1.0)
            .add(&weighted(&x.narrow(0, 3, 3).unwrap(), 2.0))
            .unwrap();
        let loss = if whole_first {
            whole.add(&views)
        } else {
            views.add(&whole)
        }
        .unwrap();
        assert_eq!(
            gradient(&leaf, loss),
            by_rows([1.5, 1.5, 1.5, 2.5, 2.5, 2.5]),
            "whole first: {whole_first}"
        );
    }
}

#[test]
fn views_along_different_axes_of_one_tensor_each_land_where_they_came_from() {
    let (leaf, x) = source();
    let rows = x.narrow(0, 0, 6).unwrap();
    let columns = x.narrow(1, 1, 2).unwrap();
    let loss = weighted(&rows, 1.0).add(&weighted(&columns, 4.0)).unwrap();
    let expected: Vec<f32> = (0..24)
        .map(|i| if matches!(i % 4, 1 | 2) { 10.0 } else { 2.0 })
        .collect();
    assert_eq!(gradient(&leaf, loss), expected);
}

#[test]
fn views_of_views_reach_the_source() {
    let (leaf, x) = source();
    // The top half split again into rows: pieces of a piece.
    let top = x.narrow(0, 0, 3).unwrap();
    let loss = weighted(&top.narrow(0, 0, 1).unwrap(), 1.0)
        .add(&weighted(&top.narrow(0, 1, 2).unwrap(), 7.0))
        .unwrap()
        .add(&weighted(&x.narrow(0, 3, 3).unwrap(), -1.0))
        .unwrap();
    assert_eq!(gradient(&leaf, loss), by_rows([1.0, 7.0, 7.0, -1.0, -1.0, -1.0]));
}
