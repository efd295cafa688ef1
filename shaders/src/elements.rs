//! How a shader reads and writes the elements of a float alias, whatever the type bound to it.
//! For each float alias `A` the composer defines `A_PER_WORD` (elements per storage word),
//! `A_load(word, i)` (element `i` as f32, given the word holding it, `A_word(i)`), `A_pack(lo,
//! hi)` (a storage word from one element, or two for bf16) and `A_round(x)` (`x` as an element of
//! `A` holds it: a fused kernel rounds where the ops it fuses would store). `bf16` is a storage
//! type of its own: WGSL has none, so its elements are the 16-bit halves of u32 words (element
//! 2w in the low half of word w) and every value in flight is f32.

/// The element functions of alias `alias` bound to `ty`; None for types that are not floats.
pub fn functions(alias: &str, ty: &str) -> Option<String> {
    let template = match ty {
        "f32" | "f16" => WORD_PER_ELEMENT,
        "bf16" => TWO_PER_WORD,
        _ => return None,
    };
    Some(template.replace("{A}", alias))
}

/// The WGSL type that stores `ty`'s elements (bf16's words are u32).
pub fn storage(ty: &str) -> &str {
    match ty {
        "bf16" => "u32",
        other => other,
    }
}

// `{A}` stands for the alias' name.
const WORD_PER_ELEMENT: &str = "
const {A}_PER_WORD: u32 = 1u;
fn {A}_word(i: u32) -> u32 { return i; }
fn {A}_load(word: {A}, i: u32) -> f32 { return f32(word); }
fn {A}_pack(lo: f32, hi: f32) -> {A} { return {A}(lo); }
fn {A}_round(x: f32) -> f32 { return f32({A}(x)); }
";

const TWO_PER_WORD: &str = "
const {A}_PER_WORD: u32 = 2u;
fn {A}_word(i: u32) -> u32 { return i >> 1u; }
fn {A}_load(word: u32, i: u32) -> f32 { return bf16_at(word, i); }
fn {A}_pack(lo: f32, hi: f32) -> u32 { return round_to_bf16(lo) | (round_to_bf16(hi) << 16u); }
fn {A}_round(x: f32) -> f32 { return bitcast<f32>(round_to_bf16(x) << 16u); }
";
