//! The multi-tensor ops on wgpu, turned on (software adapters such as lavapipe have them off by
//! default): the conformance cases with the adapter's own limits (up to eight tensors a
//! dispatch) and with WebGPU's default limits (eight storage buffers: Adam's four a tensor
//! leave it one tensor a dispatch, so it loops), and turned off (the per-tensor defaults), and
//! the dispatches a call records (`cast_copies`: the bf16 copies of twenty weights).

mod support;

use lockstep_core::backend::{AdamOperands, AdamStep, BufferRef, ReduceKind, SgdOperands, SgdStep};
use lockstep_core::conformance::{all_cases, format_table, run_case};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Device, HostVec};

fn cases_pass_on(device: &Device) {
    let ops = [
        "adam_steps",
        "sgd_steps",
        "sum_of_squares",
        "scaled_copies",
        "non_finite_count",
        "cast_copies",
    ];
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| ops.contains(&c.ops[0].as_str()))
        .collect();
    assert_eq!(cases.len(), 8, "the multi-tensor cases");
    let reports: Vec<_> = [DType::F32, DType::BF16]
        .iter()
        .flat_map(|&dtype| cases.iter().filter_map(move |c| run_case(c, device, dtype)))
        .collect();
    println!("{}", format_table(&reports));
    assert!(reports.iter().all(|r| r.passed()), "{}", format_table(&reports));
}

#[test]
fn multi_tensor_cases_pass_with_either_limits_and_turned_off() {
    if support::wgpu_device().is_none() {
        return;
    }
    let adapter = lockstep_wgpu::adapter(0).expect("the first adapter").limits();
    for (limits, on) in [
        (adapter.clone(), true),
        (wgpu::Limits::default(), true),
        (adapter, false),
    ] {
        let Some((device, backend)) = support::private_wgpu_device(limits) else {
            return;
        };
        backend.set_multi_tensor(on);
        cases_pass_on(&device);
    }
}

/// `n` values of tensor `k` on `device`.
fn buffer(device: &Device, k: usize, n: usize) -> BufferRef {
    let v: Vec<f32> = (0..n).map(|i| ((i * 31 + k * 7) % 17) as f32 / 8.0 - 1.0).collect();
    device.backend().from_host(&HostVec::F32(v)).unwrap()
}

/// Dispatches `call` records on `device`.
fn dispatches(device: &Device, call: impl FnOnce()) -> u64 {
    let before = device.backend().work_counters().kernels.unwrap();
    call();
    device.backend().work_counters().kernels.unwrap() - before
}

#[test]
fn twenty_parameters_take_as_many_dispatches_as_the_binding_limit_requires() {
    if support::wgpu_device().is_none() {
        return;
    }
    let limits = lockstep_wgpu::adapter(0).expect("the first adapter").limits();
    let buffers = limits.max_storage_buffers_per_shader_stage;
    let slots = |per_tensor: u32| ((buffers - 1) / per_tensor).min(8) as u64;
    if slots(4) < 2 {
        eprintln!("*** SKIPPED: the adapter binds too few storage buffers a shader ***");
        return;
    }
    // A device of its own, so no other test's work lands in its counters.
    let Some((device, device_backend)) = support::private_wgpu_device(limits) else {
        return;
    };
    device_backend.set_multi_tensor(true);
    let sets: Vec<[BufferRef; 4]> = (0..20)
        .map(|k| std::array::from_fn(|r| buffer(&device, 4 * k + r, 1 + 37 * k)))
        .collect();
    let adam = AdamStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
        step: 1,
    };
    let adam_items: Vec<AdamOperands> = sets
        .iter()
        .map(|[p, g, m, v]| AdamOperands {
            param: p,
            grad: g,
            exp_avg: m,
            exp_avg_sq: v,
            step: adam,
        })
        .collect();
    let sgd = SgdStep {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 5e-4,
        nesterov: false,
        first_step: false,
    };
    let sgd_items: Vec<SgdOperands> = sets
        .iter()
        .map(|[p, g, b, _]| SgdOperands {
            param: p,
            grad: g,
            momentum_buf: Some(b),
            step: sgd,
        })
        .collect();
    let backend = device.backend();
    assert_eq!(
        dispatches(&device, || backend.adam_steps(&adam_items).unwrap()),
        20u64.div_ceil(slots(4))
    );
    assert_eq!(
        dispatches(&device, || backend.sgd_steps(&sgd_items).unwrap()),
        20u64.div_ceil(slots(3))
    );
    // A count per tensor (each under one workgroup's 4096 elements), then one reduce of them;
    // a dispatch binds the counts besides the params and its tensors.
    let grads: Vec<&BufferRef> = sets.iter().map(|[_, g, _, _]| g).collect();
    let counts = buffer(&device, 0, 20);
    let reduce = dispatches(&device, || {
        backend
            .reduce(ReduceKind::Sum, &counts, &Layout::contiguous([20]), &[0])
            .unwrap();
    });
    assert_eq!(
        dispatches(&device, || {
            backend.non_finite_count(&grads).unwrap();
        }),
        20u64.div_ceil(u64::from(buffers - 2).min(8)) + reduce
    );
    // The weights' bf16 copies: two buffers a tensor, as many dispatches as the scaled copies'.
    let weights: Vec<&BufferRef> = sets.iter().map(|[p, _, _, _]| p).collect();
    assert_eq!(
        dispatches(&device, || {
            backend.cast_copies(&weights, DType::BF16).unwrap();
        }),
        20u64.div_ceil(slots(2))
    );
    device_backend.set_multi_tensor(false);
    assert_eq!(
        dispatches(&device, || backend.adam_steps(&adam_items).unwrap()),
        20,
        "off: one a tensor"
    );
    assert_eq!(
        dispatches(&device, || {
            backend.cast_copies(&weights, DType::BF16).unwrap();
        }),
        20,
        "off: one cast a tensor"
    );
    assert!(
        dispatches(&device, || {
            backend.non_finite_count(&grads).unwrap();
        }) >= 40,
        "off: a count and a sum a tensor at least"
    );
}
