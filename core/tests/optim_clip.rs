//! Gradient clipping against PyTorch.
//! Reference values: scripts/reference_values.py, section `clipping`:
//! `torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)` and `clip_grad_value_(params, 0.3)`
//! where the grads are pat([2,3],5) and pat([4],3) and a third parameter has no grad.

mod nn_support;

use lockstep_core::optim::{clip_grad_norm, clip_grad_norm_with_type, clip_grad_value, grad_norm};
use lockstep_core::{DType, Device, Tensor};
use nn_support::{assert_close, pat, values};

/// PyTorch's values, as scripts/reference_values.py prints them (kept on one line each).
#[rustfmt::skip]
mod pytorch {
    pub const CLIP_L2_TOTAL: f32 = 1.9565597;
    pub const CLIP_L2_GRADS: [f32; 10] = [-0.51110095, -0.19166285, 0.12777524, 0.44721332, -0.3194381, 0.0, -0.51110095, -0.3194381, -0.12777524, 0.06388762];
    pub const CLIP_INF_TOTAL: f32 = 1.0;
    pub const CLIP_INF_GRADS: [f32; 10] = [-0.49999952, -0.18749982, 0.12499988, 0.43749958, -0.3124997, 0.0, -0.49999952, -0.3124997, -0.12499988, 0.06249994];
    pub const CLIP_L1_NOOP_TOTAL: f32 = 5.125;
    pub const CLIP_L1_NOOP_GRADS: [f32; 10] = [-1.0, -0.375, 0.25, 0.875, -0.625, 0.0, -1.0, -0.625, -0.25, 0.125];
    pub const CLIP_L3_TOTAL: f32 = 1.4803574;
    pub const CLIP_L3_GRADS: [f32; 10] = [-0.5066341, -0.1899878, 0.12665853, 0.44330484, -0.31664634, 0.0, -0.5066341, -0.31664634, -0.12665853, 0.063329265];
    pub const CLIP_VALUE_GRADS: [f32; 10] = [-0.3, -0.3, 0.25, 0.3, -0.3, 0.0, -0.3, -0.3, -0.25, 0.125];
}
use pytorch::*;

fn params() -> Vec<Tensor> {
    let dev = Device::cpu();
    let ps = vec![
        Tensor::zeros([2, 3], DType::F32, &dev).unwrap().requires_grad(true),
        Tensor::zeros([4], DType::F32, &dev).unwrap().requires_grad(true),
        Tensor::zeros([2], DType::F32, &dev).unwrap().requires_grad(true),
    ];
    ps[0].set_grad(Some(pat(&[2, 3], 5)));
    ps[1].set_grad(Some(pat(&[4], 3)));
    ps
}

fn grads(ps: &[Tensor]) -> Vec<f32> {
    ps.iter().filter_map(|p| p.grad()).flat_map(|g| values(&g)).collect()
}

#[test]
fn clip_grad_norm_matches_pytorch_for_l2_inf_l1_and_l3() {
    for (what, max_norm, norm_type, total, clipped) in [
        ("L2", 1.0, 2.0, CLIP_L2_TOTAL, &CLIP_L2_GRADS),
        ("inf", 0.5, f64::INFINITY, CLIP_INF_TOTAL, &CLIP_INF_GRADS),
        (
            "L1, below max_norm",
            100.0,
            1.0,
            CLIP_L1_NOOP_TOTAL,
            &CLIP_L1_NOOP_GRADS,
        ),
        ("L3", 0.75, 3.0, CLIP_L3_TOTAL, &CLIP_L3_GRADS),
    ] {
        let ps = params();
        let norm = clip_grad_norm_with_type(&ps, max_norm, norm_type).unwrap();
        assert_eq!(
            norm.dims(),
            &[] as &[usize],
            "{what}: the total norm is a scalar tensor"
        );
        assert_close(&format!("{what} total norm"), &values(&norm), &[total], 1e-6);
        assert_close(&format!("{what} clipped grads"), &grads(&ps), clipped, 1e-6);
        assert!(ps[2].grad().is_none(), "{what}: a missing grad stays missing");
    }
}

/// PyTorch's `clip_grad_norm_(params, max_norm)` leaves `norm_type` at 2: so does ours.
#[test]
fn clip_grad_norm_defaults_to_the_2_norm() {
    let ps = params();
    let norm = clip_grad_norm(&ps, 1.0).unwrap();
    assert_close("default total norm", &values(&norm), &[CLIP_L2_TOTAL], 1e-6);
    assert_close("default clipped grads", &grads(&ps), &CLIP_L2_GRADS, 1e-6);
}

#[test]
fn clip_grad_value_matches_pytorch() {
    let ps = params();
    clip_grad_value(&ps, 0.3).unwrap();
    assert_close("clip_grad_value", &grads(&ps), &CLIP_VALUE_GRADS, 1e-7);
}

#[test]
fn clipping_edge_cases() {
    // No gradients at all: a zero norm, as PyTorch returns.
    let dev = Device::cpu();
    let bare = vec![Tensor::zeros([3], DType::F32, &dev).unwrap().requires_grad(true)];
    assert_eq!(values(&clip_grad_norm(&bare, 1.0).unwrap()), vec![0.0]);
    // grad_norm alone measures without touching the gradients.
    let ps = params();
    assert_close(
        "grad_norm",
        &values(&grad_norm(&ps, 2.0).unwrap()),
        &[CLIP_L2_TOTAL],
        1e-6,
    );
    assert_eq!(grads(&ps), grads(&params()));
    assert!(clip_grad_norm_with_type(&ps, 1.0, 0.0).is_err());
    assert!(clip_grad_norm(&ps, -1.0).is_err());
    assert!(clip_grad_norm_with_type(&ps, 1.0, f64::NAN).is_err());
    assert!(clip_grad_value(&ps, -0.5).is_err());
}

/// Both operands of a same-shape add receive one gradient tensor; each must be scaled once.
#[test]
fn gradients_shared_between_parameters_are_scaled_once() {
    let a = pat(&[4], 5).requires_grad(true);
    let b = pat(&[4], 3).requires_grad(true);
    a.add(&b)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    // Each grad is [3, 3, 3, 3]: the total L2 norm is sqrt(8 * 9) and the coefficient 1/sqrt(72).
    let total = clip_grad_norm(&[a.clone(), b.clone()], 1.0).unwrap();
    assert_close("total", &values(&total), &[72f32.sqrt()], 1e-6);
    let expected = vec![3.0 / (72f32.sqrt() + 1e-6); 4];
    assert_close("a.grad", &values(&a.grad().unwrap()), &expected, 1e-6);
    assert_close("b.grad", &values(&b.grad().unwrap()), &expected, 1e-6);
}
