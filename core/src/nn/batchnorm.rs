//! Batch normalisation over axis 1, with PyTorch's parameters (weight, bias) and buffers
//! (running_mean, running_var, num_batches_tracked) so state dicts carry over unchanged. With a
//! communicator (`Module::convert_sync_batchnorm`) it is PyTorch's SyncBatchNorm: in training,
//! the batch statistics cover the batches of every replica.

use std::sync::Arc;

use super::layer_error::raised_by;
use super::module::{Module, join_name, remap, remap_opt};
use crate::backend::Communicator;
use crate::device::Device;
use crate::distributed::synced_batch_stats;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::{BatchStatsFn, Epilogue, Running, Tensor};

/// Which PyTorch class a `BatchNorm` stands for: it fixes the accepted input ranks and the name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `[N, C]` or `[N, C, L]`.
    OneD,
    /// `[N, C, H, W]`.
    TwoD,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::OneD => "BatchNorm1d",
            Kind::TwoD => "BatchNorm2d",
        }
    }
    fn accepts(self, rank: usize) -> bool {
        match self {
            Kind::OneD => rank == 2 || rank == 3,
            Kind::TwoD => rank == 4,
        }
    }
    fn expected(self) -> &'static str {
        match self {
            Kind::OneD => "[N, C] or [N, C, L]",
            Kind::TwoD => "[N, C, H, W]",
        }
    }
}

/// Training normalises with the batch statistics and updates the running ones (momentum 0.1,
/// unbiased variance); evaluation normalises with the running statistics. Synchronised (SyncBatchNorm),
/// training takes the statistics over every replica's batch; evaluation never communicates. A clone
/// shares the parameters and the running statistics (tensors are handles).
#[derive(Clone)]
pub struct BatchNorm {
    kind: Kind,
    /// Scale (ones), absent when not affine.
    pub weight: Option<Tensor>,
    /// Shift (zeros), absent when not affine.
    pub bias: Option<Tensor>,
    /// Per-channel `[C]` mean, initialised to 0 and blended with each training batch's mean by `momentum`.
    pub running_mean: Tensor,
    /// Per-channel `[C]` unbiased variance, initialised to 1 and blended with each training batch's by `momentum`.
    pub running_var: Tensor,
    /// I64 scalar, as in PyTorch; counts training batches.
    pub num_batches_tracked: Tensor,
    momentum: f64,
    eps: f64,
    training: bool,
    /// Set by `convert_sync_batchnorm`: the replicas whose batches share statistics.
    sync: Option<Arc<dyn Communicator>>,
}

/// Declares `$class`, a [`BatchNorm`] of one kind with PyTorch's class name as its own type, so a
/// `#[derive(Module)]` field can be typed `BatchNorm2d` as in PyTorch. It derefs to `BatchNorm`
/// and converts into one (`.into()`) where a field or a function wants the general type.
macro_rules! batch_norm_class {
    ($(#[$doc:meta])* $class:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $class(BatchNorm);

        impl $class {
            /// A layer over `num_features` channels, as PyTorch's class of this name builds it
            /// (affine, momentum 0.1, eps 1e-5).
            pub fn new(num_features: usize, device: &Device) -> Result<$class> {
                BatchNorm::new($kind, num_features, device).map($class)
            }
            /// See [`BatchNorm::momentum`].
            pub fn momentum(self, momentum: f64) -> Result<$class> {
                self.0.momentum(momentum).map($class)
            }
            /// See [`BatchNorm::eps`].
            pub fn eps(self, eps: f64) -> Result<$class> {
                self.0.eps(eps).map($class)
            }
            /// See [`BatchNorm::without_affine`].
            pub fn without_affine(self) -> $class {
                $class(self.0.without_affine())
            }
        }

        impl std::ops::Deref for $class {
            type Target = BatchNorm;
            fn deref(&self) -> &BatchNorm {
                &self.0
            }
        }

        impl std::ops::DerefMut for $class {
            fn deref_mut(&mut self) -> &mut BatchNorm {
                &mut self.0
            }
        }

        impl From<$class> for BatchNorm {
            fn from(layer: $class) -> BatchNorm {
                layer.0
            }
        }

        impl Module for $class {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.0.forward(x)
            }
            fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
                self.0.map_tensors(f)
            }
            fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
                self.0.visit_parameters(prefix, f)
            }
            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
                self.0.visit_buffers(prefix, f)
            }
            fn set_training(&mut self, training: bool) {
                self.0.set_training(training)
            }
            fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
                self.0.convert_sync_batchnorm(comm)
            }
            fn describe(&self) -> String {
                self.0.describe()
            }
        }
    };
}

batch_norm_class!(
    /// `torch.nn.BatchNorm1d`: batch norm over the channels of `[N, C]` or `[N, C, L]` inputs.
    BatchNorm1d,
    Kind::OneD
);
batch_norm_class!(
    /// `torch.nn.BatchNorm2d`: batch norm over the channels of `[N, C, H, W]` inputs.
    BatchNorm2d,
    Kind::TwoD
);

impl BatchNorm {
    fn new(kind: Kind, num_features: usize, device: &Device) -> Result<BatchNorm> {
        if num_features == 0 {
            return Err(Error::invalid(kind.name(), "num_features must be at least 1"));
        }
        let c = [num_features];
        Ok(BatchNorm {
            kind,
            weight: Some(Tensor::ones(c, DType::F32, device)?.requires_grad(true)),
            bias: Some(Tensor::zeros(c, DType::F32, device)?.requires_grad(true)),
            running_mean: Tensor::zeros(c, DType::F32, device)?,
            running_var: Tensor::ones(c, DType::F32, device)?,
            num_batches_tracked: Tensor::zeros(Shape::scalar(), DType::I64, device)?,
            momentum: 0.1,
            eps: 1e-5,
            training: true,
            sync: None,
        })
    }
    /// Weight of the newest batch in the running statistics, in [0, 1] (PyTorch's default 0.1).
    pub fn momentum(self, momentum: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&momentum) {
            return Err(Error::invalid(
                self.kind.name(),
                format!("momentum must be in [0, 1], got {momentum}"),
            ));
        }
        Ok(BatchNorm { momentum, ..self })
    }
    /// Added to the variance for stability; must be positive (PyTorch's default 1e-5).
    pub fn eps(self, eps: f64) -> Result<Self> {
        if eps.is_nan() || eps <= 0.0 {
            return Err(Error::invalid(
                self.kind.name(),
                format!("eps must be positive, got {eps}"),
            ));
        }
        Ok(BatchNorm { eps, ..self })
    }
    /// Without the affine weight and bias (PyTorch's `affine=False`).
    pub fn without_affine(self) -> Self {
        BatchNorm {
            weight: None,
            bias: None,
            ..self
        }
    }
    /// The number of channels: the size axis 1 of the input must have.
    pub fn num_features(&self) -> usize {
        self.running_mean.elem_count()
    }
    /// True in training mode (batch statistics, running statistics updated), false after `eval`.
    pub fn is_training(&self) -> bool {
        self.training
    }
    /// True after `convert_sync_batchnorm`: a SyncBatchNorm.
    pub fn is_synchronized(&self) -> bool {
        self.sync.is_some()
    }

    /// `relu(self.forward(x))`, as a block that follows its batch norm with a ReLU computes it:
    /// in the normalising pass where the backend fuses the two (wgpu, in training), so the
    /// activation costs no pass of its own either way.
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        let then = Epilogue {
            residual: None,
            relu: true,
        };
        raised_by(self.normalise(x, then), &self.running_mean)
    }
    /// `relu(self.forward(x) + shortcut)`, as a residual block ends: in the normalising pass
    /// where the backend fuses them (wgpu, in training). `shortcut` has the output's shape.
    pub fn forward_add_relu(&self, x: &Tensor, shortcut: &Tensor) -> Result<Tensor> {
        let then = Epilogue {
            residual: Some(shortcut),
            relu: true,
        };
        raised_by(self.normalise(x, then), &self.running_mean)
    }
    /// The layer's computation, followed by `then` (`forward` marks its errors as this layer's).
    fn normalise(&self, x: &Tensor, then: Epilogue<'_>) -> Result<Tensor> {
        let name = self.kind.name();
        if !self.kind.accepts(x.rank()) {
            return Err(Error::invalid(
                name,
                format!("expects input {}, got shape {}", self.kind.expected(), x.shape()),
            ));
        }
        if x.dims()[1] != self.num_features() {
            let hint = format!(
                "input has {} features on axis 1, the layer has num_features={}",
                x.dims()[1],
                self.num_features()
            );
            return Err(Error::shape(name, x.shape(), self.running_mean.shape(), hint));
        }
        // Training blends the batch into the running statistics and counts it, in one pass
        // where the backend can, with no read-back.
        let running = Running {
            mean: &self.running_mean,
            var: &self.running_var,
            batches: Some(&self.num_batches_tracked),
            momentum: self.momentum,
        };
        let (w, b) = (self.weight.as_ref(), self.bias.as_ref());
        // As PyTorch: synchronise only when training over more than one replica.
        let synced;
        let stats: Option<&BatchStatsFn<'_>> = match &self.sync {
            _ if !self.training => None,
            Some(comm) if comm.world_size() > 1 => {
                synced = |x: &Tensor, axes: &[isize]| synced_batch_stats(x, axes, comm);
                Some(&synced)
            }
            _ => return x.batch_norm_local(&running, w, b, self.eps, then),
        };
        then.apply(x.batch_norm_with(&running, w, b, stats, self.eps)?)
    }
}

impl Module for BatchNorm {
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        remap_opt(&mut self.weight, f)?;
        remap_opt(&mut self.bias, f)?;
        remap(&mut self.running_mean, f)?;
        remap(&mut self.running_var, f)?;
        remap(&mut self.num_batches_tracked, f)
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        raised_by(self.normalise(x, Epilogue::default()), &self.running_mean)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        if let (Some(w), Some(b)) = (&self.weight, &self.bias) {
            f(join_name(prefix, "weight"), w);
            f(join_name(prefix, "bias"), b);
        }
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join_name(prefix, "running_mean"), &self.running_mean);
        f(join_name(prefix, "running_var"), &self.running_var);
        f(join_name(prefix, "num_batches_tracked"), &self.num_batches_tracked);
    }
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.sync = Some(comm.clone());
    }
    fn describe(&self) -> String {
        let affine = if self.weight.is_some() { "True" } else { "False" };
        // PyTorch's SyncBatchNorm is one class for every input rank.
        let class = if self.sync.is_some() {
            "SyncBatchNorm"
        } else {
            self.kind.name()
        };
        format!(
            "{class}({}, eps={}, momentum={}, affine={affine}, track_running_stats=True)",
            self.num_features(),
            py_float(self.eps),
            self.momentum
        )
    }
}

/// A float as Python's `repr` writes it: scientific below 1e-4 with a two-digit exponent (`1e-05`).
fn py_float(x: f64) -> String {
    if x == 0.0 || x.abs() >= 1e-4 {
        return format!("{x}");
    }
    let s = format!("{x:e}");
    match s.split_once("e-") {
        Some((mantissa, exp)) => format!("{mantissa}e-{exp:0>2}"),
        None => s,
    }
}
