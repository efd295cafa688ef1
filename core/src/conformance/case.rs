//! What one conformance case is: named inputs that every device builds from the same host values,
//! a forward pass over `Tensor`s, the backend methods it exercises, and optionally a plain-f64
//! oracle that checks the CPU reference itself.

use std::fmt::Write as _;
use std::sync::Arc;

use super::host::HostTensor;
use crate::device::Device;
use crate::dtype::{DType, HostVec};
use crate::error::Result;
use crate::rng;
use crate::tensor::Tensor;

/// Maps the inputs (on the device, in the dtype, views applied) to the outputs to compare.
pub type Forward = Arc<dyn Fn(&Ctx, &[Tensor]) -> Result<Vec<Tensor>> + Send + Sync>;
/// Computes the forward outputs from the logical input values, in plain f64 on the host.
pub(crate) type Oracle = Arc<dyn Fn(&[HostTensor]) -> Vec<HostTensor> + Send + Sync>;

/// Where and how one evaluation of a case runs.
pub struct Ctx<'a> {
    /// The device the inputs were built on and the forward pass runs on (the CPU for the reference).
    pub device: &'a Device,
    /// The dtype of this evaluation's float tensors (F64 for the reference).
    pub dtype: DType,
    /// The dtype under test: lets a case pick the same secondary dtypes (casts) in the reference.
    pub under_test: DType,
    /// The case's seed, for cases that draw random numbers on the device.
    pub seed: u64,
}

impl Ctx<'_> {
    /// `t` in f32 on a device under test (to exercise an op on f32 beside the 16-bit dtype under
    /// test); unchanged in the f64 reference.
    pub fn widened(&self, t: &Tensor) -> Result<Tensor> {
        match self.dtype {
            DType::F64 => Ok(t.clone()),
            _ => t.to_dtype(DType::F32),
        }
    }
}

/// How an input's values are drawn. All are deterministic functions of the case seed.
#[derive(Clone, Debug)]
pub enum Values {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Inclusive lower bound.
        low: f64,
        /// Exclusive upper bound.
        high: f64,
    },
    /// Drawn from the normal distribution N(mean, std²).
    Normal {
        /// Mean of the distribution.
        mean: f64,
        /// Standard deviation of the distribution.
        std: f64,
    },
    /// `center ± m` with `m` uniform in `[lo, hi]` and a random sign: keeps finite differences
    /// away from kinks at `center` (relu and abs at 0, clamps at their bound).
    AwayFrom {
        /// The kink to stay away from.
        center: f64,
        /// Smallest distance from `center`.
        lo: f64,
        /// Largest distance from `center`.
        hi: f64,
    },
    /// Evenly spaced over `[low, high)` in random order: no ties for max, min and their gradients.
    Distinct {
        /// Lower end of the range; the smallest value lies half a step above it.
        low: f64,
        /// Upper end of the range; the largest value lies half a step below it.
        high: f64,
    },
    /// `step * (k + phase)` for random integers `k` in `[-half_range, half_range]`. Exact in every
    /// float dtype; two inputs with different phases never tie, equal phases tie on purpose.
    Lattice {
        /// Spacing of the lattice.
        step: f64,
        /// Offset added to `k`, in units of `step`.
        phase: f64,
        /// Largest |k|: the lattice has `2 * half_range + 1` points.
        half_range: u32,
    },
    /// Random integers in `[0, bound)`: indices or labels.
    Indices {
        /// Exclusive upper bound of the integers.
        bound: usize,
    },
    /// Random 0/1 (a `where_cond` mask).
    Mask,
    /// Exactly these values, in row-major storage order (as many as the shape holds).
    Given(Vec<f64>),
}

/// The element type of an input: the dtype under test, or a fixed integer type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The evaluation's float dtype: the dtype under test on the device, F64 for the reference.
    Float,
    /// Unsigned 32-bit integers (indices, masks).
    U32,
    /// Signed 64-bit integers (labels, as PyTorch's `long`).
    I64,
}

/// A view applied to an input after it is created, so the backend sees strided layouts.
#[derive(Clone, Debug)]
pub enum View {
    /// Axes reordered as `Tensor::permute` does.
    Permute(Vec<usize>),
    /// A slice along one axis, as `Tensor::narrow`.
    Narrow {
        /// The axis sliced.
        axis: usize,
        /// First index kept along `axis`.
        start: usize,
        /// Number of indices kept along `axis`.
        len: usize,
    },
    /// Broadcast (stride 0) to these dims.
    Broadcast(Vec<usize>),
}

/// One named input of a case: its storage shape, how its values are drawn, its element type and the views the
/// forward pass sees it through.
#[derive(Clone, Debug)]
pub struct Input {
    /// Name shown in reports; the input's gradient result is called `grad:<name>`.
    pub name: &'static str,
    /// The shape of the storage, before views.
    pub shape: Vec<usize>,
    /// How the storage values are drawn from the case seed.
    pub values: Values,
    /// Element type; only `Kind::Float` inputs can have a gradient.
    pub kind: Kind,
    /// Views applied in order after the tensor is created, so backends see strided layouts.
    pub views: Vec<View>,
    /// Whether the input's gradient is compared (float inputs of differentiable cases).
    pub grad: bool,
}

impl Input {
    /// A float input drawn from `values`, whose gradient is compared.
    pub fn float(name: &'static str, shape: impl Into<Vec<usize>>, values: Values) -> Input {
        Input {
            name,
            shape: shape.into(),
            values,
            kind: Kind::Float,
            views: Vec::new(),
            grad: true,
        }
    }
    /// A U32 input of random integers in `[0, bound)` (indices), without a gradient.
    pub fn indices(name: &'static str, shape: impl Into<Vec<usize>>, bound: usize) -> Input {
        Input {
            name,
            shape: shape.into(),
            values: Values::Indices { bound },
            kind: Kind::U32,
            views: Vec::new(),
            grad: false,
        }
    }
    /// An I64 input of random integers in `[0, bound)` (class labels), without a gradient.
    pub fn labels_i64(name: &'static str, shape: impl Into<Vec<usize>>, bound: usize) -> Input {
        Input {
            kind: Kind::I64,
            ..Input::indices(name, shape, bound)
        }
    }
    /// A U32 input of random 0/1 values (a `where_cond` mask), without a gradient.
    pub fn mask(name: &'static str, shape: impl Into<Vec<usize>>) -> Input {
        Input {
            name,
            shape: shape.into(),
            values: Values::Mask,
            kind: Kind::U32,
            views: Vec::new(),
            grad: false,
        }
    }
    /// Leaves this input's gradient out of the comparison.
    pub fn no_grad(mut self) -> Input {
        self.grad = false;
        self
    }
    /// Sets the element type.
    pub fn kind(mut self, kind: Kind) -> Input {
        self.kind = kind;
        self
    }
    /// Appends a view, applied after the ones already added.
    pub fn view(mut self, view: View) -> Input {
        self.views.push(view);
        self
    }
    /// Stored as `shape` transposed, seen through a transposing view (the last two axes; a
    /// no-op below rank 2).
    pub fn transposed(mut self) -> Input {
        let r = self.shape.len();
        if r < 2 {
            return self;
        }
        self.shape.swap(r - 2, r - 1);
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.view(View::Permute(perm))
    }
    /// Stored with `shape`, seen broadcast to `to`.
    pub fn broadcast(self, to: impl Into<Vec<usize>>) -> Input {
        self.view(View::Broadcast(to.into()))
    }

    /// The shape the forward pass sees (after the views).
    pub fn logical_shape(&self) -> Vec<usize> {
        let mut dims = self.shape.clone();
        for v in &self.views {
            dims = match v {
                View::Permute(p) => p.iter().map(|&i| dims[i]).collect(),
                View::Narrow { axis, len, .. } => {
                    let mut d = dims.clone();
                    d[*axis] = *len;
                    d
                }
                View::Broadcast(to) => to.clone(),
            };
        }
        dims
    }

    /// The storage values, drawn from the case seed and this input's position; float values are
    /// rounded to `dtype` so every device and the reference start from identical numbers.
    pub(crate) fn generate(&self, seed: u64, position: usize, dtype: DType) -> HostTensor {
        let n: usize = self.shape.iter().product();
        // Each input owns a disjoint range of the counter space.
        let base = (position as u64 + 1) << 40;
        let u = |i: usize| rng::uniform_at(seed, base, i);
        let u2 = |i: usize| rng::uniform_at(seed, base + (1 << 39), i);
        let values: Vec<f64> = match &self.values {
            Values::Uniform { low, high } => (0..n).map(|i| low + (high - low) * u(i)).collect(),
            Values::Normal { mean, std } => (0..n).map(|i| mean + std * rng::normal_at(seed, base, i)).collect(),
            Values::AwayFrom { center, lo, hi } => (0..n)
                .map(|i| center + if u2(i) < 0.5 { -1.0 } else { 1.0 } * (lo + (hi - lo) * u(i)))
                .collect(),
            Values::Distinct { low, high } => {
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by(|&a, &b| u(a).total_cmp(&u(b)).then(a.cmp(&b)));
                let mut v = vec![0.0; n];
                for (rank, &i) in order.iter().enumerate() {
                    v[i] = low + (high - low) * (rank as f64 + 0.5) / n as f64;
                }
                v
            }
            Values::Lattice {
                step,
                phase,
                half_range,
            } => {
                let span = 2 * *half_range as usize + 1;
                (0..n)
                    .map(|i| step * (((u(i) * span as f64) as usize).min(span - 1) as f64 - *half_range as f64 + phase))
                    .collect()
            }
            Values::Indices { bound } => (0..n)
                .map(|i| ((u(i) * *bound as f64) as usize).min(bound.saturating_sub(1)) as f64)
                .collect(),
            Values::Mask => (0..n).map(|i| if u(i) < 0.5 { 0.0 } else { 1.0 }).collect(),
            Values::Given(v) => v.clone(),
        };
        let values = match self.kind {
            Kind::Float => HostVec::from_f64(dtype, &values).to_f64_vec(),
            Kind::U32 | Kind::I64 => values,
        };
        HostTensor::new(self.shape.clone(), values)
    }

    fn label(&self) -> String {
        let mut s = dims_label(&self.logical_shape());
        for v in &self.views {
            s.push_str(match v {
                View::Permute(p) if p.len() >= 2 && p[..p.len() - 2].iter().enumerate().all(|(i, &a)| a == i) => "(T)",
                View::Permute(_) => "(perm)",
                View::Narrow { .. } => "(narrow)",
                View::Broadcast(_) => "(bcast)",
            });
        }
        match self.kind {
            Kind::Float => s,
            Kind::U32 => format!("{s}:u32"),
            Kind::I64 => format!("{s}:i64"),
        }
    }
}

/// `7x13`, or `scalar` for rank 0.
pub(crate) fn dims_label(dims: &[usize]) -> String {
    if dims.is_empty() {
        return "scalar".into();
    }
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
}

/// One conformance case. `name` is unique; `ops` are the backend methods it exercises, written
/// `method` or `method:variant` (`unary:gelu`, `reduce:argmax`, `compare:eq`).
pub struct Case {
    /// Unique case name, e.g. `matmul_transposed`, shown in reports.
    pub name: String,
    /// Backend methods exercised, as `method` or `method:variant`.
    pub ops: Vec<String>,
    /// Inputs in the order the forward pass receives them.
    pub inputs: Vec<Input>,
    /// Whether input gradients are compared (and checked by finite differences).
    pub backward: bool,
    /// Whether the finite-difference check applies (false where the forward pass rounds on
    /// purpose, e.g. casts to a narrower dtype, so it has no useful derivative in f64).
    pub gradcheck: bool,
    /// The dtypes this case runs in; None: every float dtype.
    pub dtypes: Option<Vec<DType>>,
    /// Multiplies the dtype's tolerance, for ops that amplify rounding (long sums, pow).
    pub tol_scale: f64,
    /// The operation under test: maps the input tensors to the outputs to compare.
    pub forward: Forward,
    /// Optional plain-f64 implementation that checks the CPU reference's forward values.
    pub(crate) oracle: Option<Oracle>,
}

impl Case {
    /// A case named `name` exercising `ops` through `forward`: differentiable, gradient-checked, every float
    /// dtype, tolerance scale 1, no inputs yet.
    pub fn new(
        name: impl Into<String>,
        ops: &[&str],
        forward: impl Fn(&Ctx, &[Tensor]) -> Result<Vec<Tensor>> + Send + Sync + 'static,
    ) -> Case {
        Case {
            name: name.into(),
            ops: ops.iter().map(|s| s.to_string()).collect(),
            inputs: Vec::new(),
            backward: true,
            gradcheck: true,
            dtypes: None,
            tol_scale: 1.0,
            forward: Arc::new(forward),
            oracle: None,
        }
    }
    /// Appends an input (the forward pass receives them in order).
    pub fn input(mut self, input: Input) -> Case {
        self.inputs.push(input);
        self
    }
    /// Compares forward outputs only: no backward pass and no finite-difference check.
    pub fn forward_only(mut self) -> Case {
        self.backward = false;
        self.gradcheck = false;
        self
    }
    /// Keeps the backward comparison but skips the finite-difference check.
    pub fn no_gradcheck(mut self) -> Case {
        self.gradcheck = false;
        self
    }
    /// Restricts the case to `dtypes` (by default every float dtype).
    pub fn dtypes(mut self, dtypes: &[DType]) -> Case {
        self.dtypes = Some(dtypes.to_vec());
        self
    }
    /// Multiplies the dtype's tolerance by `scale`, for ops that amplify rounding.
    pub fn tol_scale(mut self, scale: f64) -> Case {
        self.tol_scale = scale;
        self
    }
    /// Adds a plain-f64 oracle that `run_oracles` checks the forward outputs against.
    pub(crate) fn oracle(mut self, oracle: impl Fn(&[HostTensor]) -> Vec<HostTensor> + Send + Sync + 'static) -> Case {
        self.oracle = Some(Arc::new(oracle));
        self
    }

    /// Deterministic per-case seed (FNV-1a of the name), so cases do not share random streams.
    pub fn seed(&self) -> u64 {
        self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Whether the case runs in `dtype`.
    pub fn runs_in(&self, dtype: DType) -> bool {
        match &self.dtypes {
            Some(list) => list.contains(&dtype),
            None => dtype.is_float(),
        }
    }

    /// The storage values of every input, rounded to `dtype`.
    pub(crate) fn host_inputs(&self, dtype: DType) -> Vec<HostTensor> {
        let seed = self.seed();
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, input)| input.generate(seed, i, dtype))
            .collect()
    }

    /// The input shapes as the forward pass sees them, e.g. `x:13x7(T) y:13`.
    pub fn shapes_label(&self) -> String {
        let mut s = String::new();
        for (i, input) in self.inputs.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{}:{}", input.name, input.label());
        }
        if s.is_empty() { "-".into() } else { s }
    }
}

/// Weights `w` of the scalar `sum(out * w)` whose gradient the cases compare: uniform in
/// `[-1, 1]`, rounded to `dtype`, a function of (seed, output position) only.
pub(crate) fn output_weights(seed: u64, output: usize, len: usize, dtype: DType) -> Vec<f64> {
    let base = (1000 + output as u64) << 40;
    let w: Vec<f64> = (0..len).map(|i| 2.0 * rng::uniform_at(seed, base, i) - 1.0).collect();
    HostVec::from_f64(dtype, &w).to_f64_vec()
}
