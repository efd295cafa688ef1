//! Every kernel file compiles with NVRTC for sm_80 and sm_90 — no GPU needed, only libnvrtc
//! (CI installs the PyPI wheel nvidia-cuda-nvrtc 13.0 and sets LOCKSTEP_EXPECT_NVRTC=1, which
//! turns a missing library into a failure instead of a loud skip).

use super::*;

pub(crate) fn nvrtc_or_skip() -> bool {
    if nvrtc_present() {
        return true;
    }
    assert!(
        std::env::var("LOCKSTEP_EXPECT_NVRTC").as_deref() != Ok("1"),
        "LOCKSTEP_EXPECT_NVRTC=1 but libnvrtc.so.13 did not load: {}",
        CompileError::NoNvrtc
    );
    eprintln!("\n*** SKIPPED: {} ***\n", CompileError::NoNvrtc);
    false
}

#[test]
fn every_kernel_compiles_for_ampere_and_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    let mut failures = Vec::new();
    for arch in ["sm_80", "sm_90"] {
        for kernel in ALL {
            match compile(kernel.name, &kernel.program(), arch) {
                Ok(cubin) => {
                    assert!(
                        crate::cubin::is_plausible_cubin(&cubin),
                        "{} for {arch} is not a whole ELF cubin (the disk cache would reject it)",
                        kernel.name
                    );
                    // The source reader that the CUDA backend's CPU test trusts agrees with NVRTC.
                    for entry in kernel.entry_points().unwrap() {
                        assert!(
                            has_symbol(&cubin, &entry),
                            "{entry} is not in {}.cu's cubin",
                            kernel.name
                        );
                    }
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_entry_point_the_backend_launches_is_defined() {
    if !nvrtc_or_skip() {
        return;
    }
    // A few names the backend builds from dtype suffixes; a renamed macro would break them.
    for (kernel, entry) in [
        (ELEMENTWISE, "unary_bf16"),
        (ELEMENTWISE, "compare_i64"),
        (ELEMENTWISE, "where_cond_u64"),
        (LAYOUT, "cast_i64_f16"),
        (LAYOUT, "cast_bf16_u32"),
        (LAYOUT, "copy_strided_u16"),
        (REDUCE, "reduce_f16"),
        (OPTIM, "adam_step_f32"),
        (OPTIM, "adam_steps_bf16"),
        (OPTIM, "sgd_steps_f16"),
        (OPTIM, "sum_of_squares_f32"),
        (OPTIM, "sum_partials"),
        (OPTIM, "scaled_copies_bf16"),
        (INDEX, "add_at_bf16"),
        (SOFTMAX, "causal_softmax_bf16"),
        (SOFTMAX, "causal_softmax_backward_f16"),
        (CROSS_ENTROPY, "cross_entropy_bf16"),
        (CROSS_ENTROPY, "cross_entropy_backward_f16"),
        (ATTENTION, "causal_attention_bf16_d64"),
        (ATTENTION, "causal_attention_dq_f16_d128"),
        (ATTENTION, "causal_attention_dkdv_bf16_d32"),
        (ATTENTION, "causal_attention_row_stats_f16"),
        (ATTENTION, "causal_attention_dq_pipelined_bf16_d64"),
        (RAND, "dropout_f32"),
        (BATCH_NORM, "batch_norm_moments_f32"),
        (BATCH_NORM, "batch_norm_input_grad_f32"),
        (BATCH_NORM, "batch_norm_running_f32"),
        (LAYER_NORM, "layer_norm_bf16"),
        (LAYER_NORM, "layer_norm_backward_f16"),
        (LAYER_NORM, "layer_norm_column_sums_f32"),
    ] {
        let cubin = compile(kernel.name, &kernel.program(), "sm_90").unwrap();
        assert!(
            has_symbol(&cubin, entry),
            "{entry} is not in {}.cu's cubin",
            kernel.name
        );
    }
}

/// Whether `name` appears in `cubin` as a whole NUL-terminated string (as symbol names do).
fn has_symbol(cubin: &[u8], name: &str) -> bool {
    cubin
        .windows(name.len() + 1)
        .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
}

/// (entry point, bytes of stack frame) from ptxas's `-v` report, where a line "Function
/// properties for NAME" comes before one holding "N bytes stack frame".
fn stack_frames(log: &str) -> Vec<(String, usize)> {
    let mut frames = Vec::new();
    let mut entry = None;
    for line in log.lines() {
        if let Some(name) = line.split("Function properties for ").nth(1) {
            entry = Some(name.trim().to_string());
        } else if let Some((before, _)) = line.split_once(" bytes stack frame")
            && let (Some(name), Some(Ok(bytes))) = (entry.take(), before.split_whitespace().last().map(str::parse))
        {
            frames.push((name, bytes));
        }
    }
    frames
}

#[test]
fn strided_kernels_index_their_parameters_without_a_stack_frame() {
    if !nvrtc_or_skip() {
        return;
    }
    // Indexing a kernel's Shape/View/SubShape parameters by a runtime rank made every thread copy
    // them to a stack frame in local memory and read them back for each element (on an H200 those
    // kernels moved 0.5-1.4 TB/s of its 4.8).
    let mut framed = Vec::new();
    let mut seen = 0;
    for kernel in [ELEMENTWISE, LAYOUT, REDUCE] {
        let (_, log) = compile::compile_logged(kernel.name, &kernel.program(), "sm_90", &["--ptxas-options=-v"])
            .unwrap_or_else(|e| panic!("{e}"));
        let frames = stack_frames(&log);
        assert!(!frames.is_empty(), "no ptxas report for {}.cu:\n{log}", kernel.name);
        seen += frames.len();
        framed.extend(frames.into_iter().filter(|(_, bytes)| *bytes > 0));
    }
    assert!(seen >= 40, "only {seen} entry points reported");
    assert!(framed.is_empty(), "entry points with a stack frame: {framed:?}");
}

#[test]
fn attention_kernels_keep_their_tiles_in_registers() {
    if !nvrtc_or_skip() {
        return;
    }
    // The accumulator tiles are register arrays indexed by unrolled constants; a spill would put
    // them in local memory (ptxas spilled 8 bytes in one sm_80 entry until the kernels were
    // bounded to one block of 128 threads an SM).
    for arch in ["sm_80", "sm_90"] {
        let (_, log) = compile::compile_logged(ATTENTION.name, &ATTENTION.program(), arch, &["--ptxas-options=-v"])
            .unwrap_or_else(|e| panic!("{e}"));
        let frames = stack_frames(&log);
        assert!(
            frames.len() >= 20,
            "only {} attention entry points reported for {arch}:\n{log}",
            frames.len()
        );
        let framed: Vec<_> = frames.into_iter().filter(|(_, bytes)| *bytes > 0).collect();
        assert!(
            framed.is_empty(),
            "attention entry points with a stack frame on {arch}: {framed:?}"
        );
    }
}

#[test]
fn a_broken_kernel_reports_the_compiler_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = compile(
        "broken",
        "extern \"C\" __global__ void k() { undefined_name = 1; }",
        "sm_90",
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("broken.cu") && text.contains("undefined_name"), "{text}");
}
