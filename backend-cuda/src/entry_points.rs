//! Every kernel entry point the backend launches, as static names: families of one kernel file
//! that differ only by dtype (`axpy_f32`, `axpy_f16`, `axpy_bf16`), picked by the dtype of a
//! launch. Each entry point also has a slot, its place in each device's table of loaded
//! functions (`Gpu::function`), so a launch finds its function without formatting a name,
//! hashing it or taking a lock.
//!
//! The `names!` arms spell each kind's names in the order its `of` counts dtypes; the tests
//! check both against each other and every name against its kernel file's source.

use lockstep_core::{DType, Error, Result};
use lockstep_kernels::KernelSource;

/// One entry point: its kernel file, its name there and its slot in each device's table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryPoint {
    pub(crate) file: KernelSource,
    pub(crate) name: &'static str,
    pub(crate) slot: usize,
}

/// The entry points of one family, in their kind's order, in slots from `first_slot` on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Family {
    file: KernelSource,
    names: &'static [&'static str],
    first_slot: usize,
}

impl Family {
    const fn entry(&self, i: usize) -> EntryPoint {
        EntryPoint {
            file: self.file,
            name: self.names[i],
            slot: self.first_slot + i,
        }
    }

    /// The slot after this family's last.
    const fn end(&self) -> usize {
        self.first_slot + self.names.len()
    }

    /// Its entry points, for the tests.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = EntryPoint> + '_ {
        (0..self.names.len()).map(|i| self.entry(i))
    }
}

/// Declares each kind of family: a `Family` whose names follow the `names!` arm of its name.
macro_rules! kinds {
    ($($(#[$doc:meta])* $kind:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $kind(Family);
    )*};
}

kinds! {
    /// A single entry point (no dtype in its name, or one dtype only).
    One;
    /// One entry point per float dtype the kernels compute with: `_f32`, `_f16`, `_bf16`.
    Floats;
    /// One per element width, for kernels that only move bits: `_u16`, `_u32`, `_u64`.
    Widths;
    /// One per dtype but f64, for kernels that read values: `_u32`, `_i64`, then the floats.
    Values;
    /// The fused attention kernels: one per half dtype and head dim, `_f16_d32` … `_bf16_d128`.
    HalfHeads;
    /// One per half dtype: `_f16`, `_bf16`.
    Halves;
}

/// The names of a family of `kind` from `prefix`, in the order its `of` picks them.
macro_rules! names {
    (One, $p:literal) => { [$p] };
    (Floats, $p:literal) => { names!($p; "_f32" "_f16" "_bf16") };
    (Widths, $p:literal) => { names!($p; "_u16" "_u32" "_u64") };
    (Values, $p:literal) => { names!($p; "_u32" "_i64" "_f32" "_f16" "_bf16") };
    (HalfHeads, $p:literal) => { names!($p; "_f16_d32" "_f16_d64" "_f16_d128" "_bf16_d32" "_bf16_d64" "_bf16_d128") };
    (Halves, $p:literal) => { names!($p; "_f16" "_bf16") };
    ($p:literal; $($suffix:literal)*) => { [$(concat!($p, $suffix)),*] };
}

/// Declares each family as a const, its slots following the previous family's, then `SLOTS`
/// (the length of a device's table) and `ALL` (every family, for the tests).
macro_rules! families {
    ($($(#[$doc:meta])* $name:ident: $kind:ident = $file:ident $prefix:literal;)*) => {
        families!(@from 0; $($(#[$doc])* $name: $kind = $file $prefix;)*);
        /// Every family, for the tests.
        #[cfg(test)]
        pub(crate) const ALL: &[Family] = &[$($name.0),*];
    };
    (@from $first:expr;) => {
        /// Entry points in all: the length of each device's table of loaded functions.
        pub(crate) const SLOTS: usize = $first;
    };
    (@from $first:expr; $(#[$doc:meta])* $name:ident: $kind:ident = $file:ident $prefix:literal; $($rest:tt)*) => {
        $(#[$doc])*
        pub(crate) const $name: $kind = $kind(Family {
            file: lockstep_kernels::$file,
            names: &names!($kind, $prefix),
            first_slot: $first,
        });
        families!(@from $name.0.end(); $($rest)*);
    };
}

families! {
    FILL: Widths = FILL "fill";
    RAND: Floats = RAND "rand";
    DROPOUT: Floats = RAND "dropout";
    COPY_STRIDED: Widths = LAYOUT "copy_strided";
    CAST_FROM_U32: Values = LAYOUT "cast_u32";
    CAST_FROM_I64: Values = LAYOUT "cast_i64";
    CAST_FROM_F32: Values = LAYOUT "cast_f32";
    CAST_FROM_F16: Values = LAYOUT "cast_f16";
    CAST_FROM_BF16: Values = LAYOUT "cast_bf16";
    UNARY: Floats = ELEMENTWISE "unary";
    BINARY: Floats = ELEMENTWISE "binary";
    BINARY_MIXED: Halves = ELEMENTWISE "binary_f32_and";
    BIAS_ACT: Floats = ELEMENTWISE "bias_act";
    BIAS_ACT_GRAD: Floats = ELEMENTWISE "bias_act_grad";
    COMPARE: Values = ELEMENTWISE "compare";
    WHERE_COND: Widths = ELEMENTWISE "where_cond";
    REDUCE: Floats = REDUCE "reduce";
    COMBINE_CHUNKS: Floats = REDUCE "combine_chunks";
    REDUCE_COLUMNS: Floats = REDUCE "reduce_columns";
    SOFTMAX: Floats = SOFTMAX "softmax";
    SOFTMAX_BACKWARD: Floats = SOFTMAX "softmax_backward";
    CAUSAL_SOFTMAX: Floats = SOFTMAX "causal_softmax";
    CAUSAL_SOFTMAX_BACKWARD: Floats = SOFTMAX "causal_softmax_backward";
    CROSS_ENTROPY: Floats = CROSS_ENTROPY "cross_entropy";
    CROSS_ENTROPY_BACKWARD: Floats = CROSS_ENTROPY "cross_entropy_backward";
    LAYER_NORM: Floats = LAYER_NORM "layer_norm";
    LAYER_NORM_BACKWARD: Floats = LAYER_NORM "layer_norm_backward";
    LAYER_NORM_COLUMN_SUMS: Floats = LAYER_NORM "layer_norm_column_sums";
    LAYER_NORM_TO_HALF: Halves = LAYER_NORM "layer_norm_f32_to";
    LAYER_NORM_BACKWARD_FROM_HALF: Halves = LAYER_NORM "layer_norm_backward_f32_from";
    ADD_LAYER_NORM: Floats = LAYER_NORM "add_layer_norm";
    ADD_LAYER_NORM_HALF: Halves = LAYER_NORM "add_layer_norm_f32";
    BATCH_NORM_MOMENTS: Floats = BATCH_NORM "batch_norm_moments";
    BATCH_NORM_STATISTICS: One = BATCH_NORM "batch_norm_statistics_f32";
    BATCH_NORM_NORMALIZE: Floats = BATCH_NORM "batch_norm_normalize";
    BATCH_NORM_GRAD_SUMS: Floats = BATCH_NORM "batch_norm_grad_sums";
    BATCH_NORM_GRAD_TOTALS: One = BATCH_NORM "batch_norm_grad_totals_f32";
    BATCH_NORM_INPUT_GRAD: Floats = BATCH_NORM "batch_norm_input_grad";
    BATCH_NORM_RUNNING: One = BATCH_NORM "batch_norm_running_f32";
    INDEX_SELECT: Widths = INDEX "index_select";
    GATHER: Widths = INDEX "gather";
    ADD_AT: Floats = INDEX "add_at";
    LINK_SOURCES: One = INDEX "link_sources";
    ADD_LINKED: Floats = INDEX "add_linked";
    IM2COL: Floats = CONV "im2col";
    COL2IM: Floats = CONV "col2im";
    MAX_POOL2D: Floats = CONV "max_pool2d";
    MAX_POOL2D_BACKWARD: Floats = CONV "max_pool2d_backward";
    AXPY: Floats = OPTIM "axpy";
    SGD_STEP: Floats = OPTIM "sgd_step";
    ADAM_STEP: Floats = OPTIM "adam_step";
    ADAM_STEPS: Floats = OPTIM "adam_steps";
    SGD_STEPS: Floats = OPTIM "sgd_steps";
    SUM_OF_SQUARES: Floats = OPTIM "sum_of_squares";
    NON_FINITE_COUNT: Floats = OPTIM "non_finite_count";
    SUM_PARTIALS: One = OPTIM "sum_partials";
    SCALED_COPIES: Floats = OPTIM "scaled_copies";
    CAST_COPIES: Floats = OPTIM "cast_copies";
    CAUSAL_ATTENTION: HalfHeads = ATTENTION "causal_attention";
    CAUSAL_ATTENTION_DQ: HalfHeads = ATTENTION "causal_attention_dq";
    CAUSAL_ATTENTION_DKDV: HalfHeads = ATTENTION "causal_attention_dkdv";
    CAUSAL_ATTENTION_PIPELINED: HalfHeads = ATTENTION "causal_attention_pipelined";
    CAUSAL_ATTENTION_DQ_PIPELINED: HalfHeads = ATTENTION "causal_attention_dq_pipelined";
    CAUSAL_ATTENTION_DKDV_PIPELINED: HalfHeads = ATTENTION "causal_attention_dkdv_pipelined";
    CAUSAL_ATTENTION_ROW_STATS: Halves = ATTENTION "causal_attention_row_stats";
}

/// The casts from each value dtype, in `value_index` order.
const CASTS: [Values; 5] = [
    CAST_FROM_U32,
    CAST_FROM_I64,
    CAST_FROM_F32,
    CAST_FROM_F16,
    CAST_FROM_BF16,
];

/// The head dims attention.cu instantiates (its ATTENTION_HEADS), in `HalfHeads` order.
pub(crate) const ATTENTION_HEAD_DIMS: [usize; 3] = [32, 64, 128];

/// The position of a float dtype the kernels compute with (in f32): f32, f16, bf16.
pub(crate) fn float_index(op: &'static str, dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 => Ok(0),
        DType::F16 => Ok(1),
        DType::BF16 => Ok(2),
        _ => Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: " by the CUDA backend (f32, f16 and bf16; f64 is the CPU's, for gradient checks)",
        }),
    }
}

/// The position of a dtype's element width among 2, 4 and 8 bytes (i64 the only 8-byte one).
pub(crate) fn width_index(op: &'static str, dtype: DType) -> Result<usize> {
    match dtype.size_in_bytes() {
        2 => Ok(0),
        4 => Ok(1),
        8 if dtype == DType::I64 => Ok(2),
        _ => Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: " by the CUDA backend (f64 is the CPU's, for gradient checks)",
        }),
    }
}

/// The position of a dtype but f64 (casts, comparisons): u32, i64, then the floats.
fn value_index(op: &'static str, dtype: DType) -> Result<usize> {
    match dtype {
        DType::U32 => Ok(0),
        DType::I64 => Ok(1),
        d => Ok(2 + float_index(op, d)?),
    }
}

/// The position of a half dtype: f16, bf16.
fn half_index(op: &'static str, dtype: DType) -> Result<usize> {
    match dtype {
        DType::F16 => Ok(0),
        DType::BF16 => Ok(1),
        _ => Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: " by these fused kernels (f16 and bf16; other dtypes take the composed path)",
        }),
    }
}

impl One {
    pub(crate) const fn entry(&self) -> EntryPoint {
        self.0.entry(0)
    }
}

/// `of(op, dtype)` for each kind picked by one dtype, through its index function.
macro_rules! picked_by_dtype {
    ($($kind:ident by $index:ident;)*) => {$(
        impl $kind {
            /// The entry point for `dtype`, or the error `op` gives for a dtype it lacks.
            pub(crate) fn of(&self, op: &'static str, dtype: DType) -> Result<EntryPoint> {
                Ok(self.0.entry($index(op, dtype)?))
            }
        }
    )*};
}

picked_by_dtype! {
    Floats by float_index;
    Widths by width_index;
    Values by value_index;
    Halves by half_index;
}

impl HalfHeads {
    /// The entry point for `dtype` (f16 or bf16) and `head_dim` (one of `ATTENTION_HEAD_DIMS`).
    pub(crate) fn of(&self, op: &'static str, dtype: DType, head_dim: usize) -> Result<EntryPoint> {
        let head = ATTENTION_HEAD_DIMS
            .iter()
            .position(|&d| d == head_dim)
            .ok_or_else(|| Error::InvalidArgument {
                op,
                msg: format!("the fused attention kernels take head dims {ATTENTION_HEAD_DIMS:?}, not {head_dim}"),
            })?;
        Ok(self.0.entry(half_index(op, dtype)? * ATTENTION_HEAD_DIMS.len() + head))
    }
}

/// The cast kernel from `from` to `to`.
pub(crate) fn cast(op: &'static str, from: DType, to: DType) -> Result<EntryPoint> {
    CASTS[value_index(op, from)?].of(op, to)
}

#[cfg(test)]
mod tests;
