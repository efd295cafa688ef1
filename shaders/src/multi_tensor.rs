//! The multi-tensor shaders, generated for `k` tensors a dispatch: WGSL cannot index bindings
//! with a run-time value, so each tensor (a "slot") has its own bindings and a function of its
//! own, and a `switch` on the slot a workgroup belongs to picks it. The host lays the slots'
//! workgroups end to end: params hold, per slot from word 2, its first workgroup, its length and
//! its constants (`SLOT_WORDS` words). f32 tensors only (`cast_copies` writes bf16 copies of
//! them). `sum_of_squares` and `non_finite_count` share one reduction and differ in the `term`
//! each element adds.

use crate::COMMON;

/// The ops generated, with the storage buffers each slot binds.
pub const MULTI_TENSOR_OPS: [(&str, usize); 6] = [
    ("adam_steps", 4),
    ("sgd_steps", 3),
    ("sum_of_squares", 1),
    ("scaled_copies", 2),
    ("non_finite_count", 1),
    ("cast_copies", 2),
];

/// Words of params per slot: first workgroup, length, nine constants.
pub const SLOT_WORDS: usize = 11;

/// Elements one workgroup of `sum_of_squares` or `non_finite_count` adds (256 invocations, 16
/// each).
pub const SUM_CHUNK: usize = 4096;

/// The bindings `op` takes besides its slots (and the params at binding 0): the partial sums
/// of `sum_of_squares` and `non_finite_count`, the factor of `scaled_copies`.
pub fn extra_bindings(op: &str) -> usize {
    match op {
        "adam_steps" | "sgd_steps" | "cast_copies" => 0,
        _ => 1,
    }
}

/// The complete WGSL of `op` (one of `MULTI_TENSOR_OPS`) for `k` slots, `None` for another op.
pub fn compose_multi_tensor(op: &str, k: usize) -> Option<String> {
    let (_, per_slot) = MULTI_TENSOR_OPS.iter().find(|(name, _)| *name == op)?;
    let first_slot_binding = 1 + extra_bindings(op);
    let mut src = format!("{COMMON}\nconst K: u32 = {k}u;\nconst SLOT_WORDS: u32 = {SLOT_WORDS}u;\n");
    src += &slot_search();
    src += match op {
        "sum_of_squares" => SQUARE,
        "non_finite_count" => NON_FINITE,
        _ => "",
    };
    src += match op {
        "adam_steps" => ADAM,
        "sgd_steps" => SGD,
        "sum_of_squares" | "non_finite_count" => CHUNK_SUM,
        "cast_copies" => "",
        _ => SCALED_COPIES,
    };
    let mut cases = String::new();
    for j in 0..k {
        let b = first_slot_binding + j * per_slot;
        let slot_base = 2 + j * SLOT_WORDS;
        src += &match op {
            "adam_steps" => format!(
                "@group(0) @binding({}) var<storage, read_write> p{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read> g{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> m{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> v{j}: array<f32>;\n\
                 fn slot{j}(i: u32) {{\n\
                 \x20   if (i >= params[{}u]) {{ return; }}\n\
                 \x20   let r = adam_update({}u, p{j}[i], g{j}[i], m{j}[i], v{j}[i]);\n\
                 \x20   m{j}[i] = r.y;\n    v{j}[i] = r.z;\n    p{j}[i] = r.x;\n}}\n",
                b,
                b + 1,
                b + 2,
                b + 3,
                slot_base + 1,
                slot_base + 2
            ),
            "sgd_steps" => format!(
                "@group(0) @binding({}) var<storage, read_write> p{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read> g{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> b{j}: array<f32>;\n\
                 fn slot{j}(i: u32) {{\n\
                 \x20   if (i >= params[{}u]) {{ return; }}\n\
                 \x20   let r = sgd_update({}u, p{j}[i], g{j}[i], b{j}[i]);\n\
                 \x20   b{j}[i] = r.y;\n    p{j}[i] = r.x;\n}}\n",
                b,
                b + 1,
                b + 2,
                slot_base + 1,
                slot_base + 2
            ),
            "sum_of_squares" | "non_finite_count" => format!(
                "@group(0) @binding({b}) var<storage, read> x{j}: array<f32>;\n\
                 fn slot{j}(base: u32, lid: u32) -> f32 {{\n\
                 \x20   let end = min(base + CHUNK, params[{}u]);\n\
                 \x20   var acc = 0.0;\n\
                 \x20   for (var e = base + lid; e < end; e += WG) {{ acc += term(x{j}[e]); }}\n\
                 \x20   return acc;\n}}\n",
                slot_base + 1
            ),
            // A word of bf16 a slot element: two f32s rounded, the high half of an odd
            // length's last word 0 (constant 0: whether the length is odd).
            "cast_copies" => format!(
                "@group(0) @binding({}) var<storage, read> s{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> d{j}: array<u32>;\n\
                 fn slot{j}(i: u32) {{\n\
                 \x20   let words = params[{}u];\n\
                 \x20   if (i >= words) {{ return; }}\n\
                 \x20   let odd = param_f32({}u) != 0.0;\n\
                 \x20   let last = 2u * words - select(1u, 2u, odd);\n\
                 \x20   let hi = select(round_to_bf16(s{j}[min(2u * i + 1u, last)]), 0u, odd && i + 1u == words);\n\
                 \x20   d{j}[i] = round_to_bf16(s{j}[2u * i]) | (hi << 16u);\n}}\n",
                b,
                b + 1,
                slot_base + 1,
                slot_base + 2
            ),
            _ => format!(
                "@group(0) @binding({}) var<storage, read> s{j}: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> d{j}: array<f32>;\n\
                 fn slot{j}(i: u32) {{\n\
                 \x20   if (i >= params[{}u]) {{ return; }}\n\
                 \x20   d{j}[i] = s{j}[i] * factor[0];\n}}\n",
                b,
                b + 1,
                slot_base + 1
            ),
        };
        cases += &match op {
            "sum_of_squares" | "non_finite_count" => format!("        case {j}u: {{ acc = slot{j}(base, lid); }}\n"),
            _ => format!("        case {j}u: {{ slot{j}(i); }}\n"),
        };
    }
    src += &match op {
        "sum_of_squares" | "non_finite_count" => format!(
            "@compute @workgroup_size(256)\n\
             fn {op}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,\n\
             \x20                 @builtin(num_workgroups) groups: vec3<u32>) {{\n\
             \x20   let wg = wid.x + wid.y * groups.x;\n\
             \x20   let slot = slot_of(wg);\n\
             \x20   let base = (wg - params[2u + slot * SLOT_WORDS]) * CHUNK;\n\
             \x20   var acc = 0.0;\n\
             \x20   switch slot {{\n{cases}        default: {{}}\n    }}\n\
             \x20   let sum = workgroup_sum(lid, acc);\n\
             \x20   if (lid == 0u && wg < params[1]) {{ partials[params[0] + wg] = sum; }}\n}}\n"
        ),
        _ => format!(
            "@compute @workgroup_size(256)\n\
             fn {op}(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,\n\
             \x20   @builtin(num_workgroups) groups: vec3<u32>) {{\n\
             \x20   let wg = wid.x + wid.y * groups.x;\n\
             \x20   let slot = slot_of(wg);\n\
             \x20   let i = (wg - params[2u + slot * SLOT_WORDS]) * WG + lid;\n\
             \x20   switch slot {{\n{cases}        default: {{}}\n    }}\n}}\n"
        ),
    };
    Some(src)
}

/// The slot workgroup `wg` belongs to: the last whose first workgroup is at most `wg`.
fn slot_search() -> String {
    "fn slot_of(wg: u32) -> u32 {\n\
     \x20   var slot = 0u;\n\
     \x20   for (var j = 1u; j < K; j++) {\n\
     \x20       if (wg >= params[2u + j * SLOT_WORDS]) { slot = j; }\n\
     \x20   }\n\
     \x20   return slot;\n}\n"
        .into()
}

/// One element's Adam update from the slot's constants at `params[at..]` (as `adam_step` in
/// optim.wgsl: decay, l2, beta1, 1-beta1, beta2, 1-beta2, step_size, bias2_sqrt, eps):
/// (param, exp_avg, exp_avg_sq).
const ADAM: &str = "
fn adam_update(at: u32, p_in: f32, g_in: f32, m_in: f32, v_in: f32) -> vec3<f32> {
    let p = p_in * param_f32(at);
    let g = g_in + param_f32(at + 1u) * p;
    let m = param_f32(at + 2u) * m_in + param_f32(at + 3u) * g;
    let v = param_f32(at + 4u) * v_in + param_f32(at + 5u) * g * g;
    return vec3<f32>(p - param_f32(at + 6u) * m / (sqrt(v) / param_f32(at + 7u) + param_f32(at + 8u)), m, v);
}
";

/// One element's SGD update with momentum from the slot's constants at `params[at..]` (as
/// `sgd_momentum_step` in optim.wgsl: lr, weight_decay, keep, take, momentum, nesterov as 0 or
/// 1): (param, momentum buffer).
const SGD: &str = "
fn sgd_update(at: u32, p: f32, g: f32, b_in: f32) -> vec2<f32> {
    let d = g + param_f32(at + 1u) * p;
    let b = param_f32(at + 2u) * b_in + param_f32(at + 3u) * d;
    let update = select(b, d + param_f32(at + 4u) * b, param_f32(at + 5u) != 0.0);
    return vec2<f32>(p - param_f32(at) * update, b);
}
";

/// Each workgroup's sum of `term` over its `CHUNK` elements: each invocation its strided share
/// in order, then a fixed tree; params[0] is where this dispatch's partials start, params[1]
/// how many workgroups it has.
const CHUNK_SUM: &str = "
const CHUNK: u32 = 4096u;
@group(0) @binding(1) var<storage, read_write> partials: array<f32>;
var<workgroup> scratch: array<f32, 256>;
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var width = 128u; width > 0u; width = width / 2u) {
        if (lid < width) { scratch[lid] += scratch[lid + width]; }
        workgroupBarrier();
    }
    return scratch[0];
}
";

/// What `sum_of_squares` adds per element.
const SQUARE: &str = "fn term(x: f32) -> f32 { return x * x; }\n";

/// What `non_finite_count` adds per element: 1 for inf or NaN, judged by the exponent bits (a
/// compiler allowed to assume finite floats may fold `x != x` or `x * 0.0` away); a workgroup's
/// count (at most 4096) and their sum (up to 2^24) are exact in f32.
const NON_FINITE: &str =
    "fn term(x: f32) -> f32 { return select(0.0, 1.0, (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u); }\n";

/// `dst = src * factor[0]`, rounded once.
const SCALED_COPIES: &str = "
@group(0) @binding(1) var<storage, read> factor: array<f32>;
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_multi_tensor_shader_validates_for_one_to_eight_slots() {
        for (op, per_slot) in MULTI_TENSOR_OPS {
            for k in 1..=8 {
                let source = compose_multi_tensor(op, k).unwrap();
                let module = naga::front::wgsl::parse_str(&source)
                    .unwrap_or_else(|e| panic!("{op} x{k}:\n{}", e.emit_to_string(&source)));
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{op} x{k}:\n{}", e.emit_to_string(&source)));
                let storage = module
                    .global_variables
                    .iter()
                    .filter(|(_, v)| matches!(v.space, naga::AddressSpace::Storage { .. }))
                    .count();
                assert_eq!(
                    storage,
                    1 + extra_bindings(op) + k * per_slot,
                    "{op} x{k}: the bindings"
                );
                assert_eq!(module.entry_points[0].name, op);
            }
        }
        assert!(compose_multi_tensor("adam_step", 2).is_none());
    }
}
