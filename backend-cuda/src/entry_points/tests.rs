//! Without a GPU: every entry point the backend can launch is defined in its kernel file's
//! source, has a slot of its own, and is the one its dtype picks.

use std::collections::{HashMap, HashSet};

use super::*;

#[test]
fn every_entry_point_is_defined_in_its_kernel_file() {
    let mut defined: HashMap<&str, Vec<String>> = HashMap::new();
    let mut missing = Vec::new();
    for entry in ALL.iter().flat_map(Family::entries) {
        let names = defined
            .entry(entry.file.name)
            .or_insert_with(|| entry.file.entry_points().unwrap());
        if !names.iter().any(|n| n == entry.name) {
            missing.push(format!(
                "{} is not defined in kernels/cuda/{}.cu",
                entry.name, entry.file.name
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    // The reader found the files' kernels at all (an empty list would pass nothing above).
    assert_eq!(
        defined.len(),
        lockstep_kernels::ALL.len(),
        "a kernel file launches nothing"
    );
}

#[test]
fn every_entry_point_has_a_slot_of_its_own() {
    let entries: Vec<EntryPoint> = ALL.iter().flat_map(Family::entries).collect();
    let slots: HashSet<usize> = entries.iter().map(|e| e.slot).collect();
    assert_eq!(slots, (0..SLOTS).collect(), "slots are not 0..SLOTS, each once");
    assert_eq!(entries.len(), SLOTS);
    let names: HashSet<&str> = entries.iter().map(|e| e.name).collect();
    assert_eq!(names.len(), SLOTS, "an entry point is declared twice");
}

#[test]
fn each_dtype_picks_the_entry_point_named_for_it() {
    let name = |e: Result<EntryPoint>| e.unwrap().name;
    for (dtype, suffix) in [(DType::F32, "f32"), (DType::F16, "f16"), (DType::BF16, "bf16")] {
        assert_eq!(name(AXPY.of("t", dtype)), format!("axpy_{suffix}"));
        assert_eq!(name(COMPARE.of("t", dtype)), format!("compare_{suffix}"));
    }
    for (dtype, width) in [
        (DType::F16, "u16"),
        (DType::BF16, "u16"),
        (DType::F32, "u32"),
        (DType::U32, "u32"),
        (DType::I64, "u64"),
    ] {
        assert_eq!(name(FILL.of("t", dtype)), format!("fill_{width}"));
    }
    let values = [
        (DType::U32, "u32"),
        (DType::I64, "i64"),
        (DType::F32, "f32"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
    ];
    for (from, f) in values {
        for (to, t) in values {
            assert_eq!(name(cast("t", from, to)), format!("cast_{f}_{t}"));
        }
    }
    for (dtype, suffix) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        assert_eq!(
            name(CAUSAL_ATTENTION_ROW_STATS.of("t", dtype)),
            format!("causal_attention_row_stats_{suffix}")
        );
        for d in ATTENTION_HEAD_DIMS {
            let dq = CAUSAL_ATTENTION_DQ.of("t", dtype, d);
            assert_eq!(name(dq), format!("causal_attention_dq_{suffix}_d{d}"));
            let dkdv = CAUSAL_ATTENTION_DKDV_PIPELINED.of("t", dtype, d);
            assert_eq!(name(dkdv), format!("causal_attention_dkdv_pipelined_{suffix}_d{d}"));
        }
    }
    assert_eq!(BATCH_NORM_RUNNING.entry().name, "batch_norm_running_f32");
}

#[test]
fn a_dtype_or_head_dim_without_a_kernel_is_an_error_naming_the_op() {
    let message = |e: Result<EntryPoint>| e.unwrap_err().to_string();
    assert!(message(AXPY.of("axpy", DType::F64)).contains("axpy"));
    assert!(message(FILL.of("full", DType::F64)).contains("full"));
    assert!(message(COMPARE.of("eq", DType::F64)).contains("eq"));
    assert!(message(CAUSAL_ATTENTION.of("causal_attention", DType::F32, 64)).contains("f32"));
    assert!(message(CAUSAL_ATTENTION.of("causal_attention", DType::F16, 96)).contains("96"));
}
