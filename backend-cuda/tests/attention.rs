//! The fused attention's one-stage kernels at GPT-2's sizes (support/attention_case.rs).

#[path = "support/attention_case.rs"]
mod attention_case;
mod support;

#[test]
fn one_stage_attention_matches_the_cpu_and_repeats_bit_exactly() {
    attention_case::fused_attention_matches_the_cpu_and_repeats_bit_exactly("1");
}
