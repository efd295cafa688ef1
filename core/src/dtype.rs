//! Element types, and the host-side vectors that carry them across the Backend boundary.

use half::{bf16, f16};
use std::fmt;

use crate::error::{Error, Result};

/// The element type of a tensor, as PyTorch's `torch.dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`): the default for parameters, activations and gradients.
    F32,
    /// 16-bit IEEE half (`torch.float16`): 5 exponent bits, so mixed-precision training needs loss scaling.
    F16,
    /// 16-bit brain float (`torch.bfloat16`): f32's exponent range with an 8-bit significand.
    BF16,
    /// Double precision: the CPU backend only, for gradient checks.
    F64,
    /// Labels as PyTorch stores them; indices are converted to U32 before indexing.
    I64,
    /// Indices, argmax results and comparison masks (0 or 1) on every backend.
    U32,
}

impl DType {
    /// Every dtype, in declaration order; the MPI communicator encodes a dtype as its position here.
    pub const ALL: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U32];

    /// Bytes per element: 2, 4 or 8.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::U32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }
    /// True for the floating-point dtypes: f32, f16, bf16 and f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
    /// The lowercase name (`f32`, `bf16`, `u32`, …) used by `Display` and in error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I64 => "i64",
            DType::U32 => "u32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed host vector: what `Backend::to_host` returns and `Backend::from_host` takes.
#[derive(Clone, Debug, PartialEq)]
pub enum HostVec {
    /// Elements of an f32 tensor, in row-major order.
    F32(Vec<f32>),
    /// Elements of an f16 tensor, as `half::f16`.
    F16(Vec<f16>),
    /// Elements of a bf16 tensor, as `half::bf16`.
    BF16(Vec<bf16>),
    /// Elements of an f64 tensor (CPU only).
    F64(Vec<f64>),
    /// Elements of an i64 tensor, typically class labels.
    I64(Vec<i64>),
    /// Elements of a u32 tensor: indices, argmax results or 0/1 masks.
    U32(Vec<u32>),
}

/// Dispatches an expression over every variant of a `HostVec`-shaped enum, binding the inner vector.
#[doc(hidden)]
#[macro_export]
macro_rules! map_host_vec {
    ($value:expr, $v:ident => $body:expr) => {
        match $value {
            $crate::dtype::HostVec::F32($v) => $body,
            $crate::dtype::HostVec::F16($v) => $body,
            $crate::dtype::HostVec::BF16($v) => $body,
            $crate::dtype::HostVec::F64($v) => $body,
            $crate::dtype::HostVec::I64($v) => $body,
            $crate::dtype::HostVec::U32($v) => $body,
        }
    };
}

impl HostVec {
    /// The dtype of the elements held.
    pub fn dtype(&self) -> DType {
        match self {
            HostVec::F32(_) => DType::F32,
            HostVec::F16(_) => DType::F16,
            HostVec::BF16(_) => DType::BF16,
            HostVec::F64(_) => DType::F64,
            HostVec::I64(_) => DType::I64,
            HostVec::U32(_) => DType::U32,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        map_host_vec!(self, v => v.len())
    }
    /// True when it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A copy of the values in `range`, of the same dtype.
    pub fn slice(&self, range: std::ops::Range<usize>) -> HostVec {
        map_host_vec!(self, v => Element::into_host(v[range].to_vec()))
    }
    /// Every value as f64 (exact for all dtypes but i64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        map_host_vec!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }
    /// Values converted from f64 into `dtype` (rounding to nearest for floats, truncating for ints).
    pub fn from_f64(dtype: DType, values: &[f64]) -> HostVec {
        fn conv<T: Element>(values: &[f64]) -> Vec<T> {
            values.iter().map(|&x| T::from_f64(x)).collect()
        }
        match dtype {
            DType::F32 => HostVec::F32(conv(values)),
            DType::F16 => HostVec::F16(conv(values)),
            DType::BF16 => HostVec::BF16(conv(values)),
            DType::F64 => HostVec::F64(conv(values)),
            DType::I64 => HostVec::I64(conv(values)),
            DType::U32 => HostVec::U32(conv(values)),
        }
    }
}

/// A Rust type that a tensor can hold.
pub trait Element: Copy + Send + Sync + fmt::Debug + PartialOrd + 'static {
    /// The dtype of tensors holding this type.
    const DTYPE: DType;
    /// The value as f64 (exact for every type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64: rounding to nearest for floats, truncating toward zero and saturating for integers.
    fn from_f64(x: f64) -> Self;
    /// Wraps a vector of this type as the matching `HostVec` variant, without copying.
    fn into_host(v: Vec<Self>) -> HostVec;
    /// Takes the vector out of a `HostVec` of this element type, or says which dtype it held.
    fn from_host(v: HostVec) -> Result<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $variant:ident, |$x:ident| $to:expr, |$y:ident| $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($y: f64) -> Self {
                $from
            }
            fn into_host(v: Vec<Self>) -> HostVec {
                HostVec::$variant(v)
            }
            fn from_host(v: HostVec) -> Result<Vec<Self>> {
                match v {
                    HostVec::$variant(v) => Ok(v),
                    other => Err(Error::DTypeMismatch {
                        op: "to_vec",
                        lhs: other.dtype(),
                        rhs: DType::$variant,
                    }),
                }
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |y| y as f32);
element!(f64, F64, |x| x, |y| y);
element!(f16, F16, |x| x.to_f64(), |y| f16::from_f64(y));
element!(bf16, BF16, |x| x.to_f64(), |y| bf16::from_f64(y));
element!(i64, I64, |x| x as f64, |y| y as i64);
element!(u32, U32, |x| x as f64, |y| y as u32);
