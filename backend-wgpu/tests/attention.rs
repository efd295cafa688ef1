//! Causal attention fused on wgpu (attention.wgsl): the conformance suite's attention cases run
//! its kernels (not the composed products) and pass in every dtype, and its memory grows with t,
//! not t².

mod support;

use lockstep_core::backend::Backend;
use lockstep_core::conformance::{Outcome, all_cases, run_case};
use lockstep_core::{DType, Device, Generator, Tensor};

/// The dtypes the first adapter computes in.
fn dtypes() -> Vec<DType> {
    let mut dtypes = vec![DType::F32, DType::BF16];
    if lockstep_wgpu::adapter(0).is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16)) {
        dtypes.push(DType::F16);
    }
    dtypes
}

#[test]
fn the_attention_cases_run_the_fused_kernels_and_pass() {
    let Some((device, backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let timed = backend.gpu().features.contains(wgpu::Features::TIMESTAMP_QUERY);
    if timed {
        backend.profile_kernels(true).unwrap();
    }
    // The suite runs them all (conformance_wgpu.rs); here those of one head dim, to stay quick
    // on lavapipe, which compiles each head dim's kernels anew: one token, one tile and two.
    let picked = ["_1x1x3x1x64", "_2x17x3x3x64", "_1x128x3x1x64", "nan_1x17x3x1x64"];
    let cases: Vec<_> = all_cases()
        .into_iter()
        .filter(|c| c.name.starts_with("causal_attention/") && picked.iter().any(|p| c.name.ends_with(p)))
        .collect();
    assert_eq!(
        cases.len(),
        picked.len(),
        "the suite's attention cases changed their names"
    );
    let mut failed = Vec::new();
    for dtype in dtypes() {
        for case in &cases {
            let Some(report) = run_case(case, &device, dtype) else {
                continue;
            };
            if report.outcome != Outcome::Pass {
                failed.push(format!("{} [{dtype}]: {:?}", report.case, report.outcome));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    if !timed {
        eprintln!("NOT TESTED: this adapter has no timestamp queries, so the kernels run are not listed");
        return;
    }
    let ran: Vec<String> = backend.kernel_times().unwrap().into_iter().map(|k| k.name).collect();
    for entry in ["causal_attention", "causal_attention_dq", "causal_attention_dkdv"] {
        for ty in ["f32", "bf16"] {
            let name = format!("attention/{entry} {ty}");
            assert!(ran.iter().any(|k| k.starts_with(&name)), "{name} never ran: {ran:?}");
        }
    }
    assert!(
        !ran.iter().any(|k| k.starts_with("softmax/causal_softmax")),
        "the composed weights ran: {ran:?}"
    );
}

/// Peak pool bytes of one forward and backward pass of attention over `t` tokens (2 heads of
/// 16), on a device of its own so nothing else counts; None without an adapter.
fn peak_bytes(t: usize, fused: bool) -> Option<u64> {
    let (device, backend) = support::private_wgpu_device(wgpu::Limits::default())?;
    backend.set_attention_fused(fused);
    let host = Tensor::rand_normal(
        [1, t, 3, 2, 16],
        0.0,
        1.0,
        DType::F32,
        &Generator::new(1),
        &Device::cpu(),
    )
    .unwrap();
    let qkv = host.to_device(&device).unwrap().requires_grad(true);
    let y = qkv.causal_self_attention(None).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert!(
        qkv.grad()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|g| g.is_finite())
    );
    Some(device.backend().memory_stats().peak_allocated_bytes)
}

#[test]
fn fused_attention_memory_grows_linearly_with_t() {
    let Some(fused_256) = peak_bytes(256, true) else { return };
    let growth = |fused: bool| peak_bytes(512, fused).unwrap() as f64 / peak_bytes(256, fused).unwrap() as f64;
    let (fused, composed) = (peak_bytes(512, true).unwrap() as f64 / fused_256 as f64, growth(false));
    eprintln!("peak bytes from t = 256 to 512: fused x{fused:.2}, composed x{composed:.2}");
    assert!(fused <= 2.5, "the fused peak grew x{fused:.2} from t = 256 to 512");
    // The composed path's t x t scores make the same measure fail.
    assert!(composed >= 3.0, "the composed peak grew only x{composed:.2}");
}
