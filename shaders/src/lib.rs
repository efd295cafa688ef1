//! The WGSL compute shaders of the Lockstep wgpu backend: one file per operation family, named
//! as the core `Backend` methods they implement (`unary.wgsl` for `Backend::unary`, …).
//!
//! A shader is not compiled as it stands: the backend prepends the element-type aliases it names
//! (`alias T = f32;`, with `enable f16;` for half precision), then `common.wgsl` (the parameter
//! binding and shared helpers), then each float alias' element functions (`elements`: how a
//! shader loads and stores `T` whether it is f32, f16 or bf16 packed in u32 words), then the
//! file. `compose` does exactly that, and this crate's tests validate every shader in every
//! element type with naga, so a broken shader fails `cargo test` on a machine with no GPU at all.

pub mod elements;
pub mod multi_tensor;

/// One shader file.
#[derive(Clone, Copy, Debug)]
pub struct Shader {
    /// The file name without `.wgsl`, which is also the operation family's name.
    pub name: &'static str,
    pub source: &'static str,
    /// The type aliases the file expects the host to define (`T`, or `S` and `D`).
    pub aliases: &'static [&'static str],
    /// The element types each alias may take, e.g. `["f32", "f16", "u32"]`.
    pub types: &'static [&'static str],
    pub entry_points: &'static [&'static str],
}

/// Prepended to every shader after the aliases: the parameter binding and shared helpers.
pub const COMMON: &str = include_str!("../wgsl/common.wgsl");

const FLOATS: &[&str] = &["f32", "f16"];
/// The float types of shaders that also read and write bf16 in its packed words themselves.
const PACKED_FLOATS: &[&str] = &["f32", "f16", "bf16"];

macro_rules! shader {
    ($name:literal, $aliases:expr, $types:expr, [$($entry:literal),+ $(,)?]) => {
        Shader {
            name: $name,
            source: include_str!(concat!("../wgsl/", $name, ".wgsl")),
            aliases: $aliases,
            types: $types,
            entry_points: &[$($entry),+],
        }
    };
}

/// Every shader of the backend.
pub const SHADERS: &[Shader] = &[
    shader!("fill", &[], &[], ["fill"]),
    shader!("bf16", &[], &[], ["widen", "narrow", "copy"]),
    shader!("copy_strided", &["T"], &["u32", "f16", "vec2<u32>"], ["copy_strided"]),
    shader!(
        "cast",
        &["S", "D"],
        &["f32", "f16", "u32"],
        ["cast_strided", "cast_from_i64", "cast_to_i64"]
    ),
    shader!("rand", &["T"], FLOATS, ["dropout", "rand"]),
    shader!("unary", &["T"], PACKED_FLOATS, ["unary"]),
    shader!("binary", &["T"], PACKED_FLOATS, ["binary"]),
    shader!("binary_mixed", &["N"], &["f16", "bf16"], ["binary_mixed"]),
    shader!("bias_act", &["T"], PACKED_FLOATS, ["bias_act", "bias_act_grad"]),
    shader!(
        "cross_entropy",
        &["T"],
        PACKED_FLOATS,
        ["cross_entropy", "cross_entropy_seams", "cross_entropy_backward"]
    ),
    shader!("compare", &["T"], &["f32", "f16", "u32"], ["compare", "compare_i64"]),
    shader!("where_cond", &["T"], &["u32", "f16", "vec2<u32>"], ["where_cond"]),
    shader!(
        "reduce",
        &["S", "D"],
        PACKED_FLOATS,
        [
            "reduce",
            "argmax",
            "reduce_chunks",
            "reduce_column_chunks",
            "combine_chunks",
            "combine_chunks_argmax"
        ]
    ),
    shader!(
        "matmul",
        &["T"],
        PACKED_FLOATS,
        [
            "matmul",
            "matmul_split",
            "matmul_wide",
            "matmul_wide_split",
            "matmul_split_sum",
            "matmul_naive"
        ]
    ),
    shader!(
        "softmax",
        &["T"],
        FLOATS,
        [
            "softmax",
            "softmax_backward",
            "causal_softmax",
            "causal_softmax_backward"
        ]
    ),
    shader!(
        "layer_norm",
        &["T"],
        FLOATS,
        [
            "layer_norm",
            "layer_norm_to_bf16",
            "layer_norm_backward",
            "layer_norm_column_sums"
        ]
    ),
    shader!(
        "attention",
        &["T"],
        PACKED_FLOATS,
        ["causal_attention", "causal_attention_dq", "causal_attention_dkdv"]
    ),
    shader!(
        "batch_norm",
        &["T"],
        PACKED_FLOATS,
        [
            "moments",
            "statistics",
            "normalize",
            "grad_sums",
            "grad_totals",
            "input_grad",
            "running",
            "running_counted"
        ]
    ),
    shader!(
        "index",
        &["T"],
        &["f32", "f16", "u32"],
        ["index_select", "gather", "add_scanning", "link_sources", "add_linked"]
    ),
    shader!(
        "conv",
        &["T"],
        PACKED_FLOATS,
        ["im2col", "col2im", "max_pool2d", "max_pool2d_backward"]
    ),
    shader!("conv_gemm", &["T"], PACKED_FLOATS, ["conv_gemm", "conv_gemm_split"]),
    shader!("coop_scales", &["T"], PACKED_FLOATS, ["coop_scales"]),
    shader!(
        "optim",
        &[],
        &[],
        ["axpy", "sgd_step", "sgd_momentum_step", "adam_step"]
    ),
];

/// The cooperative-matrix product: not in `SHADERS`, since it needs an adapter with cooperative
/// matrices and is composed with their edge (`compose_cooperative`).
pub const MATMUL_COOP: Shader = shader!("matmul_coop", &["T"], PACKED_FLOATS, ["matmul_coop"]);

/// The shader named `name`.
pub fn shader(name: &str) -> Option<&'static Shader> {
    SHADERS.iter().find(|s| s.name == name)
}

/// The complete source of `shader` with its aliases bound, in order, to `types`.
pub fn compose(shader: &Shader, types: &[&str]) -> String {
    let header = if types.contains(&"f16") { "enable f16;\n" } else { "" };
    compose_after(header.into(), shader, types)
}

/// `matmul_coop` on square cooperative matrices of `edge` (8 or 16) with `grid` x `grid`
/// subgroups a workgroup, each owning `frags` x `frags` matrices of the output block: `E_EDGE`,
/// `E_GRID`, `E_FRAGS`, the matrix aliases `E_A`, `E_B` (f16 operands) and `E_C` (f32 sums), the
/// lines that name each accumulator, then elements of `types`.
pub fn compose_cooperative(edge: u32, grid: u32, frags: u32, types: &[&str]) -> String {
    let matrix = |role: &str, scalar: &str| format!("alias E_{role} = coop_mat{edge}x{edge}<{scalar}, {role}>;\n");
    let header = format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\nconst E_EDGE: u32 = {edge}u;\nconst E_GRID: u32 = {grid}u;\nconst E_FRAGS: u32 = {frags}u;\n{}{}{}",
        matrix("A", "f16"),
        matrix("B", "f16"),
        matrix("C", "f32")
    );
    let source = compose_after(header, &MATMUL_COOP, types);
    let pairs = || (0..frags).flat_map(|i| (0..frags).map(move |j| (i, j)));
    let accumulators: String = pairs().map(|(i, j)| format!("var c_{i}_{j} = E_C();\n")).collect();
    let mut products = String::new();
    for i in 0..frags {
        products += &format!("let a_{i} = coopLoadT<E_A>(&lhs_tile[(wm + {i}u * E_EDGE) * DEPTH + kk], DEPTH);\n");
        products += &format!("let b_{i} = coopLoadT<E_B>(&rhs_tile[kk * BLOCK + wn + {i}u * E_EDGE], BLOCK);\n");
    }
    products.extend(pairs().map(|(i, j)| format!("c_{i}_{j} = coopMultiplyAdd(a_{i}, b_{j}, c_{i}_{j});\n")));
    let stores: String = pairs()
        .map(|(i, j)| {
            format!(
                "coopStoreT(c_{i}_{j}, &fragments[warp * FRAGMENT], E_EDGE);\nworkgroupBarrier();\n\
                 write_fragment(f, wm + {i}u * E_EDGE, wn + {j}u * E_EDGE);\nworkgroupBarrier();\n"
            )
        })
        .collect();
    source
        .replace("//@accumulators", &accumulators)
        .replace("//@products", &products)
        .replace("//@stores", &stores)
}

fn compose_after(mut header: String, shader: &Shader, types: &[&str]) -> String {
    let mut element_functions = String::new();
    for (alias, ty) in shader.aliases.iter().zip(types) {
        header.push_str(&format!("alias {alias} = {};\n", elements::storage(ty)));
        element_functions.extend(elements::functions(alias, ty));
    }
    format!("{header}{COMMON}{element_functions}\n{}", shader.source)
}

#[cfg(test)]
mod tests;
