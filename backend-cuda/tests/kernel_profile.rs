//! `Backend::profile_kernels` on cuda:0: each launch and cuBLAS product of the profiled span is
//! tallied by name, as many launches as the work counters saw, and nothing once it is off.

mod support;

use lockstep_core::{DType, Generator, Tensor};

#[test]
fn profiled_launches_are_tallied_by_kernel_name_and_match_the_counters() {
    let Some(device) = support::cuda_device() else { return };
    let backend = device.backend();
    let x = Tensor::rand_normal(vec![64, 64], 0.0, 1.0, DType::F32, &Generator::new(1), &device).unwrap();
    let work = || {
        let y = x.matmul(&x).unwrap();
        y.add(&x).unwrap().exp().unwrap().sum_all().unwrap();
    };
    let counted = || {
        backend.synchronize().unwrap();
        let c = backend.work_counters();
        c.kernels.unwrap() + c.library_calls.unwrap()
    };
    backend.profile_kernels(true).unwrap();
    let before = counted();
    work();
    let launched = counted() - before;
    backend.profile_kernels(false).unwrap();
    let times = backend.kernel_times().unwrap();
    let names: Vec<&str> = times.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(times.iter().map(|k| k.launches).sum::<u64>(), launched, "{names:?}");
    for wanted in ["cublas gemm f32", "binary_f32", "unary_f32"] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    assert!(times.iter().all(|k| k.seconds >= 0.0));
    assert!(
        times.windows(2).all(|w| w[0].seconds >= w[1].seconds),
        "longest first: {times:?}"
    );
    work();
    assert_eq!(
        backend.kernel_times().unwrap(),
        times,
        "profiling is off: nothing more tallied"
    );
}
