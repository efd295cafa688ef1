//! The one error type of the core. Every message says what was wrong and, where it helps, what to do.

use crate::dtype::DType;
use crate::shape::Shape;

/// The error of every fallible call in the core. Its message names the operation that failed and,
/// where one exists, the fix.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Operand shapes are incompatible (broadcasting, matmul, concatenation, reshape, …).
    #[error("{op}: shapes {lhs} and {rhs} do not match ({hint})")]
    ShapeMismatch {
        /// The operation that was called (`add`, `matmul`, …).
        op: &'static str,
        /// The first operand's shape; for a broadcast, the source shape.
        lhs: Shape,
        /// The second operand's shape; for a broadcast, the target shape.
        rhs: Shape,
        /// Which dimension disagrees, e.g. `dimension 1 is 3 vs 4 and neither is 1`.
        hint: String,
    },

    /// An argument is out of range or inconsistent with the others (an axis past the rank, a
    /// kernel larger than the padded input, a zero stride, …).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The operation that rejected the argument.
        op: &'static str,
        /// What was wrong, and what would have been accepted.
        msg: String,
    },

    /// An operation got tensors on two different devices; move one with `Tensor::to_device` first.
    #[error("{op}: tensors are on different devices ({a} and {b}); move one with `to_device` first")]
    DeviceMismatch {
        /// The operation that received the tensors.
        op: &'static str,
        /// Location of the first tensor's device (`cpu:0`, `cuda:1`, …).
        a: String,
        /// Location of the second tensor's device.
        b: String,
    },

    /// The operation, or this backend, has no kernel for the dtype (float math on u32 indices,
    /// f64 on a GPU, …); convert with `Tensor::to_dtype` where that makes sense.
    #[error("{op}: dtype {dtype} is not supported here{hint}")]
    UnsupportedDType {
        /// The operation that refused the dtype.
        op: &'static str,
        /// The dtype it was given.
        dtype: DType,
        /// Extra guidance appended to the message, starting with `; ` (empty when there is none).
        hint: &'static str,
    },

    /// Two tensors that must share a dtype do not (also `to_vec::<T>()` on a tensor of another
    /// dtype); convert one with `Tensor::to_dtype` first.
    #[error("{op}: dtypes {lhs} and {rhs} differ; convert one with `to_dtype` first")]
    DTypeMismatch {
        /// The operation that compared the dtypes.
        op: &'static str,
        /// The first operand's dtype; for `to_vec`, the tensor's.
        lhs: DType,
        /// The second operand's dtype; for `to_vec`, the element type asked for.
        rhs: DType,
    },

    /// `Device::parse` found no such device: a prefix no registered backend provides, a
    /// malformed ordinal, or an ordinal past the devices present.
    #[error("unknown device `{name}`: {hint}")]
    UnknownDevice {
        /// The device name as given (`cuda:7`, `tpu`, …).
        name: String,
        /// Which names would work, e.g. the device kinds this build knows.
        hint: String,
    },

    /// `backward` cannot run: the graph was freed by an earlier backward (run the forward pass
    /// again), the tensor depends on nothing that requires grad, or a gradient never arrived.
    #[error("backward: {0}")]
    Autograd(String),

    /// A collective or the rendezvous failed on this rank: a peer left or timed out, ranks called
    /// different collectives, or their buffers disagree in size or dtype.
    #[error("collective {op} on rank {rank}: {msg}")]
    Collective {
        /// The collective that failed (`all_reduce`, `broadcast`, `recv`, `rendezvous`, …).
        op: &'static str,
        /// This process's rank in the group.
        rank: usize,
        /// What went wrong, naming the missing or disagreeing ranks where known.
        msg: String,
    },

    /// A dataset, checkpoint or log file is malformed or does not fit (wrong size, missing
    /// metadata, unparsable JSON, a checkpoint of another model).
    #[error("{what}: {msg}")]
    Data {
        /// The file or object concerned, usually its path.
        what: String,
        /// What was wrong with it.
        msg: String,
    },

    /// A layer's forward failed with `error`. `layer` is the layer's name in the model (`fc1`,
    /// `features.0`), filled in by the enclosing `#[derive(Module)]` model or `Sequential`, which
    /// find it by `parameter`, the id of one of the layer's tensors; `None` for a layer called
    /// on its own.
    #[error("{prefix}{error}", prefix = layer_prefix(.layer))]
    InLayer {
        /// The layer's dotted name in the model, once known.
        layer: Option<String>,
        /// `Tensor::id` of one of the layer's parameters or buffers.
        parameter: u64,
        // Not named `source`, as `Io::cause` below.
        /// What went wrong inside the layer (its message names the layer's class).
        error: Box<Error>,
    },

    // Not named `source`: that would make the cause print twice in error chains.
    /// An I/O call failed on a file or directory.
    #[error("{path}: {cause}")]
    Io {
        /// The path being accessed; `I/O` when converted from a bare `std::io::Error` by `?`.
        path: String,
        /// The operating system's error.
        cause: std::io::Error,
    },

    /// A tensor the device cannot hold, past its memory or the limit set on it: refused (before
    /// allocating where the size is known first, since an allocation past the machine's memory
    /// aborts the process or gets it killed part-way through).
    #[error(
        "{device}: {op} asks for {}, with {} in use, more than the {} the device may hold; to fit, try a smaller \
         --batch-size, --accumulate N (the same batch in N parts), --activation-checkpointing, --zero 2 (over \
         several devices) or --precision bf16-mixed",
        gib(*requested), gib(*in_use), gib(*capacity)
    )]
    OutOfMemory {
        /// Location of the device (`cpu:0`, …).
        device: String,
        /// The operation that asked.
        op: &'static str,
        /// Bytes asked for.
        requested: u64,
        /// Bytes in live tensors on the device when it asked.
        in_use: u64,
        /// The device's memory in bytes.
        capacity: u64,
    },

    /// A backend failed at the device level: a driver, cuBLAS or wgpu error, a failed allocation,
    /// a kernel that did not compile, a lost device.
    #[error("device {device}: {msg}")]
    Device {
        /// Location of the failing device (`cuda:0`, `wgpu:1`, …).
        device: String,
        /// The backend's description of the failure, with the driver's error code where it has one.
        msg: String,
    },
}

/// Bytes for a person: GiB with two decimals below 10 GiB, else whole (TB-sized asks read as
/// thousands of GiB, which is the point).
fn gib(bytes: u64) -> String {
    // A limit of a few MiB (a test's, a small device's) reads in MiB, not as 0.00 GiB.
    let (value, unit) = match bytes {
        0..0x10_0000 => (bytes as f64 / 1024.0, "KiB"),
        0x10_0000..0x4000_0000 => (bytes as f64 / f64::from(1 << 20), "MiB"),
        _ => (bytes as f64 / f64::from(1 << 30), "GiB"),
    };
    if value < 10.0 {
        format!("{value:.2} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

/// `fc1: ` before a layer's error once its name is known.
fn layer_prefix(layer: &Option<String>) -> String {
    layer.as_ref().map(|l| format!("{l}: ")).unwrap_or_default()
}

/// `std::result::Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::InvalidArgument`]: `op` rejected an argument because of `msg`.
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        Error::InvalidArgument { op, msg: msg.into() }
    }
    /// An [`Error::ShapeMismatch`] between `lhs` and `rhs` (cloned), with `hint` naming the dimension.
    pub fn shape(op: &'static str, lhs: &Shape, rhs: &Shape, hint: impl Into<String>) -> Self {
        Error::ShapeMismatch {
            op,
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            hint: hint.into(),
        }
    }
    /// An [`Error::Data`]: `what` (usually a file path) is unusable because of `msg`.
    pub fn data(what: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Data {
            what: what.into(),
            msg: msg.into(),
        }
    }
    /// An [`Error::Io`] naming the `path` whose access failed with `source`.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            cause: source,
        }
    }
    /// An [`Error::UnsupportedDType`] for `dtype` in `op`, with no hint.
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
