//! The entry points the CUDA backend launches for index_add / scatter_add (scanning, or linking
//! per-id lists and walking them) and for split reductions are in the compiled kernels, for every
//! float type. (Compilation needs libnvrtc only; CI sets LOCKSTEP_EXPECT_NVRTC=1.)

use lockstep_kernels::{INDEX, KernelSource, REDUCE, compile, nvrtc_present};

fn assert_defined(kernel: KernelSource, entries: &[&str]) {
    let cubin = compile(kernel.name, &kernel.program(), "sm_90").unwrap();
    for entry in entries {
        let found = cubin
            .windows(entry.len() + 1)
            .any(|w| &w[..entry.len()] == entry.as_bytes() && w[entry.len()] == 0);
        assert!(found, "{entry} is not in {}.cu's cubin", kernel.name);
    }
}

#[test]
fn the_linked_adds_and_the_split_reductions_are_defined() {
    if !nvrtc_present() {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_NVRTC").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_NVRTC=1 but libnvrtc did not load"
        );
        eprintln!("\n*** SKIPPED: no libnvrtc ***\n");
        return;
    }
    let mut index = vec!["link_sources".to_string()];
    let mut reduce = vec![];
    for t in ["f32", "f16", "bf16"] {
        index.extend([format!("add_at_{t}"), format!("add_linked_{t}")]);
        reduce.extend([format!("reduce_{t}"), format!("combine_chunks_{t}")]);
    }
    assert_defined(INDEX, &index.iter().map(String::as_str).collect::<Vec<_>>());
    assert_defined(REDUCE, &reduce.iter().map(String::as_str).collect::<Vec<_>>());
}
