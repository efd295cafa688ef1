//! The conformance suite every backend must pass against the CPU reference.
//!
//! Each case builds its inputs from the same host values on any device (deterministic, drawn
//! from the case's seed and rounded to the dtype under test), runs one operation forward and,
//! where differentiable, backward of `sum(out * w)` for fixed random weights `w`, and reads back
//! the outputs and input gradients. `run_suite` compares a device in each dtype with the CPU
//! reference computed in f64 from the same values, within per-dtype tolerances (`tolerance`);
//! `format_table` prints the result for a bug report. It is compiled into the library, so a
//! release binary (`lockstep check --device wgpu:0`) can run it without a Rust toolchain.
//!
//! Each case names the `Backend` methods it exercises, as `method` or `method:variant` with the
//! variant's `name()` (`unary:gelu`, `reduce:argmax`, `compare:eq`): one name per operation
//! everywhere. A test checks that every method of the trait and every variant of the op enums is
//! covered. The CPU reference itself is checked two ways: forward values against plain-f64
//! oracles written with index arithmetic (`run_oracles`), gradients against finite differences
//! (`gradcheck`).

mod attention_memory;
mod bias_act_bits;
mod case;
mod cases;
mod gradcheck;
pub(crate) mod host;
mod host_waits;
mod layer_norm_bits;
mod mixed_dtype_bits;
mod runner;
mod tolerance;

use std::collections::BTreeSet;

pub use attention_memory::{attention_peak_bytes, check_attention_memory_is_linear};
pub use bias_act_bits::bias_act_grad_mismatches;
pub use case::{Case, Ctx, Forward, Input, Kind, Values, View};
pub use gradcheck::{GradcheckReport, gradcheck, gradcheck_all};
pub use host_waits::training_step_host_waits;
pub use layer_norm_bits::layer_norm_gradient_bits;
pub use mixed_dtype_bits::mixed_dtype_mismatches;
pub use runner::{CaseReport, Outcome, format_table, run_case, run_oracles, run_suite};
pub use tolerance::Tolerance;

/// `Backend` methods that are not operations and need no case.
pub const NON_OP_METHODS: &[&str] = &[
    "info",
    "memory_stats",
    "work_counters",
    "profile_kernels",
    "kernel_times",
    "synchronize",
    "empty_cache",
    "set_memory_limit",
];

/// Every case of the suite, in a fixed order.
pub fn all_cases() -> Vec<Case> {
    cases::all()
}

/// The op names the cases exercise (`matmul`, `unary:gelu`, …), each method also listed bare.
pub fn covered_ops() -> BTreeSet<String> {
    let mut ops = BTreeSet::new();
    for case in all_cases() {
        for op in case.ops {
            if let Some((method, _)) = op.split_once(':') {
                ops.insert(method.to_string());
            }
            ops.insert(op);
        }
    }
    ops
}
