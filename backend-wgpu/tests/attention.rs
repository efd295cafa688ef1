//! Causal attention fused on wgpu (attention.wgsl): the conformance suite's attention cases run
//! its kernels (not the composed products) and pass in every dtype, and its memory grows with t,
//! not t².

mod support;

use lockstep_core::DType;
use lockstep_core::backend::Backend;
use lockstep_core::conformance::{Outcome, all_cases, check_attention_memory_is_linear, run_case};

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

#[test]
fn fused_attention_memory_grows_linearly_with_t() {
    if support::private_wgpu_device(wgpu::Limits::default()).is_none() {
        return;
    }
    let summary = check_attention_memory_is_linear(&mut |fused, _| {
        let (device, backend) = support::private_wgpu_device(wgpu::Limits::default()).expect("an adapter, as above");
        backend.set_attention_fused(fused);
        Ok(device)
    })
    .unwrap();
    eprintln!("{summary}");
}
