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
