//! The fused attention's pipelined kernels (two stages: the next tile's copies in flight while
//! the block works on this one) at GPT-2's sizes (support/attention_case.rs).

#[path = "support/attention_case.rs"]
mod attention_case;
mod support;

#[test]
fn pipelined_attention_matches_the_cpu_and_repeats_bit_exactly() {
    attention_case::fused_attention_matches_the_cpu_and_repeats_bit_exactly("2");
}
