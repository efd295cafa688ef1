//! The work counters `lockstep bench` reports per training step: every recorded compute dispatch
//! and every bind group counts once, an empty op counts nothing, and transfers are no dispatches;
//! the host waits for the device where it reads a value back, never inside a training step.

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
    let waited = work_after.host_waits.expect("wgpu counts host waits") - work_before.host_waits.expect("counted");
    assert_eq!(waited, 2, "each read-back waits once");
}

/// A GPT's bf16-mixed training steps (the weights' bf16 copies, forward, backward, clipping,
/// AdamW) queue their dispatches without waiting for the adapter: its queue never drains
/// mid-step.
#[test]
fn training_steps_never_wait_for_the_device() {
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let waits = lockstep_core::conformance::training_step_host_waits(&device, 3).unwrap();
    assert_eq!(waits, Some(0), "a training step waited for the adapter");
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
        // At least a dispatch per layer each way and the optimizer's (19 since the loss is fused).
        assert!(dispatches >= 10, "a training step is many dispatches, not {dispatches}");
        assert!(
            created <= 2,
            "a steady step (loss read back: {synced}) created {created} bind groups for {dispatches} dispatches"
        );
    }
    device.synchronize().unwrap();
}

/// `profile_kernels`: while on, each dispatch is timed and booked to its pipeline (shader, entry,
/// element types and constants); off, nothing more is booked; starting again clears the tally.
#[test]
fn a_kernel_profile_books_each_dispatch_to_its_kernel() {
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let backend = device.backend();
    let timestamps = device
        .info()
        .details
        .iter()
        .any(|(k, v)| k == "timestamps" && v == "yes");
    if !timestamps {
        let refused = backend
            .profile_kernels(true)
            .expect_err("no timestamps to time kernels with");
        assert!(refused.to_string().contains("timestamp"), "{refused}");
        eprintln!("NOT TESTED: this adapter has no timestamp queries, so kernel profiles are refused");
        return;
    }
    let x = Tensor::from_vec((0..4096).map(|i| i as f32 - 2000.0).collect(), [64, 64], &device).unwrap();
    backend.profile_kernels(true).unwrap();
    let dispatched_before = backend.work_counters().kernels.expect("wgpu counts dispatches");
    let y = x.relu().unwrap(); // one unary dispatch
    let sums = [y.sum(&[1], false).unwrap(), x.sum(&[1], false).unwrap()]; // two sums
    let peak = x.max(1, false).unwrap(); // one max
    let dispatched = backend.work_counters().kernels.unwrap() - dispatched_before;
    backend.profile_kernels(false).unwrap();
    drop(x.add(&x).unwrap()); // not timed
    let times = backend.kernel_times().unwrap();

    let launches = |name: &str| times.iter().find(|k| k.name == name).map(|k| k.launches);
    assert_eq!(launches("reduce/reduce f32 f32 KIND=0"), Some(2), "{times:?}");
    assert_eq!(launches("reduce/reduce f32 f32 KIND=1"), Some(1), "{times:?}");
    assert!(
        times
            .iter()
            .any(|k| k.name.starts_with("unary/unary f32") && k.launches == 1),
        "{times:?}"
    );
    assert!(
        !times.iter().any(|k| k.name.starts_with("binary/")),
        "an add after the profile stopped: {times:?}"
    );
    assert_eq!(times.iter().map(|k| k.launches).sum::<u64>(), dispatched, "{times:?}");
    assert!(
        times.iter().all(|k| k.seconds >= 0.0) && times.iter().any(|k| k.seconds > 0.0),
        "{times:?}"
    );
    assert!(
        times.windows(2).all(|w| w[0].seconds >= w[1].seconds),
        "longest first: {times:?}"
    );
    // The results are unchanged by the timing.
    assert_eq!(peak.to_vec::<f32>().unwrap()[0], -1937.0);
    assert_eq!(
        sums[0].to_vec::<f32>().unwrap()[63],
        (4032..4096).map(|i| (i - 2000) as f32).sum::<f32>()
    );

    backend.profile_kernels(true).unwrap();
    assert_eq!(
        backend.kernel_times().unwrap(),
        vec![],
        "starting again clears the tally"
    );
    backend.profile_kernels(false).unwrap();
    // The CPU cannot time kernels, and says so.
    let cpu = lockstep_core::Device::cpu();
    let refused = cpu
        .backend()
        .profile_kernels(true)
        .expect_err("the CPU has no kernel timer");
    assert!(refused.to_string().contains("cannot time its kernels"), "{refused}");
}

/// A ResNet basic block's training step (conv → bn → relu → conv → bn, + x, relu, and the
/// backward pass) in a bounded number of dispatches: 24, of which each batch norm takes 4
/// forward (moments, statistics, the normalisation with the shortcut and ReLU fused, the
/// running statistics and count in one) and 3 backward, its input read where the convolution
/// leaves it, and the final ReLU's gradient 1. Each batch norm took 14 more before (forward a
/// gather, 9 element ops for the running statistics and 4 for the count; backward a
/// transpose), bn1's ReLU 2 and the block's add and ReLU 2 more; a regression that brings back
/// any of them fails here.
#[test]
fn a_residual_blocks_training_step_stays_within_its_dispatches() {
    use lockstep_core::Generator;
    use lockstep_core::models::resnet::BasicBlock;
    use lockstep_core::nn::{BatchNorm2d, Conv2d, Conv2dConfig};

    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let generator = Generator::new(3);
    let conv = || {
        let config = Conv2dConfig::new(4, 4, 3).padding(1).bias(false);
        Conv2d::new(config, &device, &generator).unwrap()
    };
    let block = BasicBlock {
        conv1: conv(),
        bn1: BatchNorm2d::new(4, &device).unwrap(),
        conv2: conv(),
        bn2: BatchNorm2d::new(4, &device).unwrap(),
        downsample: None,
    };
    // An input without a gradient: how a leaf's gradients accumulate is not the block's work.
    let x = Tensor::rand_normal([2, 4, 6, 6], 0.0, 1.0, DType::F32, &generator, &device).unwrap();
    let dispatches = || {
        device
            .backend()
            .work_counters()
            .kernels
            .expect("wgpu counts dispatches")
    };
    let step = || {
        let before = dispatches();
        block.forward(&x).unwrap().sum_all().unwrap().backward().unwrap();
        dispatches() - before
    };
    // The first step: the gradients are new tensors, not accumulated into old ones.
    let used = step();
    assert!(used <= 24, "a basic block's training step took {used} dispatches");
    device.synchronize().unwrap();
}
