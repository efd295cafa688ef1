//! The work counters `lockstep bench` reports per training step: every recorded compute dispatch
//! and every bind group counts once, an empty op counts nothing, and transfers are no dispatches.

mod support;

use lockstep_core::{DType, Tensor};

#[test]
fn each_dispatch_and_its_bind_group_count_once() {
    // A device of its own, so no other test's work lands in its counters.
    let Some((device, backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let a = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], [4], &device).unwrap();
    let b = Tensor::from_vec(vec![0.5f32, 0.5, -5.0, 0.5], [4], &device).unwrap();
    let empty = Tensor::from_vec(Vec::<f32>::new(), [0], &device).unwrap();
    let counted = || (device.backend().work_counters(), backend.bind_groups_created());
    let (work_before, groups_before) = counted();

    let sum = a.add(&b).unwrap(); // one binary dispatch
    let relu = sum.relu().unwrap(); // one unary dispatch
    let ones = Tensor::full([4], 1.0, DType::F32, &device).unwrap(); // one fill dispatch
    // No elements, no workgroups: nothing is recorded.
    empty.add(&empty).unwrap();
    // Read-backs copy buffers, which are no dispatches.
    assert_eq!(relu.to_vec::<f32>().unwrap(), [1.5, 0.0, 0.0, 0.0]);
    assert_eq!(ones.to_vec::<f32>().unwrap(), [1.0; 4]);

    let (work_after, groups_after) = counted();
    let dispatched = work_after.kernels.expect("wgpu counts dispatches") - work_before.kernels.expect("counted");
    assert_eq!(dispatched, 3, "add, relu and full dispatch once each");
    assert_eq!(groups_after - groups_before, 3, "one bind group per dispatch");
    assert_eq!(work_after.library_calls, None, "wgpu calls no vendor library");
}

/// Bind groups are cached: a training step binds the same pooled buffers to the same pipelines as
/// the step before it, so once warm a step creates (almost) none, whether or not it waits for its
/// loss. Without the cache, every one of its dispatches would create one.
#[test]
fn a_steady_training_step_creates_almost_no_bind_groups() {
    use lockstep_core::nn::{Module, ModuleExt};
    use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
    use lockstep_core::{Generator, models};

    let Some((device, backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let generator = Generator::new(0);
    let model = models::mlp(&[16], &device, &generator).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig::new(0.01).momentum(0.9)).unwrap();
    let x = Tensor::rand_normal([4, 28 * 28], 0.0, 1.0, DType::F32, &generator, &device).unwrap();
    let y = Tensor::from_vec(vec![1u32, 7, 3, 0], [4], &device).unwrap();
    let mut step = || {
        opt.zero_grad();
        let loss = model.forward(&x).unwrap().cross_entropy(&y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        loss
    };
    // The first step also creates the momentum buffers, the second finds the pool one buffer
    // short (the first step's loss was still alive): warm up with both.
    for _ in 0..2 {
        step().item().unwrap();
    }
    let counted = || {
        let dispatches = device
            .backend()
            .work_counters()
            .kernels
            .expect("wgpu counts dispatches");
        (dispatches, backend.bind_groups_created())
    };
    for synced in [true, false] {
        let (dispatches_before, groups_before) = counted();
        let loss = step();
        if synced {
            loss.item().unwrap();
        }
        let (dispatches_after, groups_after) = counted();
        let dispatches = dispatches_after - dispatches_before;
        let created = groups_after - groups_before;
        assert!(dispatches >= 20, "a training step is many dispatches, not {dispatches}");
        assert!(
            created <= 2,
            "a steady step (loss read back: {synced}) created {created} bind groups for {dispatches} dispatches"
        );
    }
    device.synchronize().unwrap();
}
