//! The one error type of the core. Every message says what was wrong and, where it helps, what to do.

use crate::dtype::DType;
use crate::shape::Shape;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: shapes {lhs} and {rhs} do not match ({hint})")]
    ShapeMismatch {
        op: &'static str,
        lhs: Shape,
        rhs: Shape,
        hint: String,
    },

    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },

    #[error("{op}: tensors are on different devices ({a} and {b}); move one with `to_device` first")]
    DeviceMismatch { op: &'static str, a: String, b: String },

    #[error("{op}: dtype {dtype} is not supported here{hint}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        hint: &'static str,
    },

    #[error("{op}: dtypes {lhs} and {rhs} differ; convert one with `to_dtype` first")]
    DTypeMismatch { op: &'static str, lhs: DType, rhs: DType },

    #[error("unknown device `{name}`: {hint}")]
    UnknownDevice { name: String, hint: String },

    #[error("backward: {0}")]
    Autograd(String),

    #[error("collective {op} on rank {rank}: {msg}")]
    Collective { op: &'static str, rank: usize, msg: String },

    #[error("{what}: {msg}")]
    Data { what: String, msg: String },

    // Not named `source`: that would make the cause print twice in error chains.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },

    #[error("device {device}: {msg}")]
    Device { device: String, msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }
    pub fn shape(op: &'static str, lhs: &Shape, rhs: &Shape, hint: impl Into<String>) -> Self {
        Error::ShapeMismatch {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            hint: hint.into(),
        }
    }
    pub fn data(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Data {
            what: what.into(),
            msg: msg.into(),
        }
    }
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            cause: source,
        }
    }
    pub fn dtype(op: &'static str, dtype: DType) -> Self {
        Error::UnsupportedDType { op, dtype, hint: "" }
    }
}

/// `?` on an I/O call in code that returns this crate's `Result` (a user's data loader, say);
/// the error names no path, since the `io::Error` carries none.
impl From<std::io::Error> for Error {
    fn from(cause: std::io::Error) -> Error {
        Error::Io {
            path: "I/O".into(),
            cause,
        }
    }
}
