//! The user-facing tensor: a shape, a dtype, a device and a shared device buffer, plus the
//! autograd bookkeeping. Not generic: the backend is whatever device the tensor lives on.

mod adaptive_pool;
mod add_layer_norm;
mod attention;
mod batch_norm;
mod bias_act;
mod conv_product;
mod cross_entropy;
mod elementwise;
mod layer_norm;
mod linalg;
mod nn_ops;
mod reduce;
mod shape_ops;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use batch_norm::Epilogue;
pub(crate) use elementwise::unary_grad;
pub(crate) use nn_ops::{BatchStats, BatchStatsFn, Running};
pub use nn_ops::{Conv2dOptions, Pool2dOptions};

use crate::autograd::{self, Backward, Edge, Node, Window};
use crate::backend::{Backend, BufferRef, Distribution};
use crate::device::Device;
use crate::dtype::{DType, Element, HostVec};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::shape::{Layout, Shape};

/// An n-dimensional array on a [`Device`] with an autograd graph, as `torch.Tensor`; cloning is cheap
/// (shared storage and graph node).
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    id: u64,
    buffer: BufferRef,
    layout: Layout,
    dtype: DType,
    device: Device,
    /// The operation that produced this tensor, when the graph is recorded.
    grad_fn: Option<Arc<Node>>,
    /// True for leaves created with `requires_grad(true)` and for results that depend on them.
    requires_grad: bool,
    /// Accumulated gradient of a leaf.
    grad: Mutex<Option<Tensor>>,
    /// Run when a backward pass has delivered this leaf's last gradient contribution.
    hooks: Mutex<Vec<GradReadyHook>>,
}

/// Called with the leaf once its gradient for the running backward pass is final.
pub type GradReadyHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

static NEXT_TENSOR: AtomicU64 = AtomicU64::new(0);

impl Tensor {
    // --- construction ----------------------------------------------------------------------------

    pub(crate) fn from_parts(buffer: BufferRef, layout: Layout, device: Device) -> Tensor {
        let dtype = buffer.dtype();
        Tensor(Arc::new(Inner {
            id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
            buffer,
            layout,
            dtype,
            device,
            grad_fn: None,
            requires_grad: false,
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
        }))
    }

    /// A contiguous tensor over a freshly computed buffer. Also for backend crates: wraps a buffer
    /// a backend produced on `device` (contiguous, no gradient): for backend crates
    /// exposing ops beyond the `Backend` trait.
    pub fn from_buffer(buffer: BufferRef, shape: impl Into<Shape>, device: &Device) -> Tensor {
        Tensor::from_parts(buffer, Layout::contiguous(shape), device.clone())
    }

    /// The same storage seen through another layout (a view), outside the graph: callers that
    /// need a gradient through it record one with `track`.
    pub(crate) fn view(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(self.0.buffer.clone(), layout, self.0.device.clone())
    }

    /// A tensor of `shape` filled with 0, as `torch.zeros`.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }
    /// A tensor of `shape` filled with 1, as `torch.ones`.
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }
    /// A tensor of `shape` filled with `value` (converted to `dtype`), as `torch.full`.
    pub fn full(shape: impl Into<Shape>, value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        let buffer = device.backend().full(dtype, shape.elem_count(), value)?;
        Ok(Tensor::from_buffer(buffer, shape, device))
    }
    /// `[start, start+1, …, end-1]` of `dtype`.
    pub fn arange(start: i64, end: i64, dtype: DType, device: &Device) -> Result<Tensor> {
        if end < start {
            return Err(Error::invalid("arange", format!("end {end} is before start {start}")));
        }
        let values: Vec<f64> = (start..end).map(|x| x as f64).collect();
        Tensor::from_host(HostVec::from_f64(dtype, &values), [values.len()], device)
    }
    /// A tensor of `shape` from row-major `data`, with the dtype of `T`; errors if the lengths differ.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_host(T::into_host(data), shape, device)
    }
    /// As [`Tensor::from_vec`], copying `data` first.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }
    /// A tensor of `shape` from a typed host vector (row-major, its dtype kept); errors if the lengths differ.
    pub fn from_host(data: HostVec, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        let shape = shape.into();
        if shape.elem_count() != data.len() {
            return Err(Error::invalid(
                "from_vec",
                format!(
                    "{} values cannot fill shape {shape} ({} elements)",
                    data.len(),
                    shape.elem_count()
                ),
            ));
        }
        let buffer = device.backend().from_host(&data)?;
        Ok(Tensor::from_buffer(buffer, shape, device))
    }
    /// Uniform on `[low, high)`, drawn from `generator` (the same values on every backend).
    pub fn rand_uniform(
        shape: impl Into<Shape>,
        low: f64,
        high: f64,
        dtype: DType,
        generator: &Generator,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::random(
            shape.into(),
            Distribution::Uniform { low, high },
            dtype,
            generator,
            device,
        )
    }
    /// Normal with `mean` and `std`, drawn from `generator`.
    pub fn rand_normal(
        shape: impl Into<Shape>,
        mean: f64,
        std: f64,
        dtype: DType,
        generator: &Generator,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::random(
            shape.into(),
            Distribution::Normal { mean, std },
            dtype,
            generator,
            device,
        )
    }
    fn random(
        shape: Shape,
        dist: Distribution,
        dtype: DType,
        generator: &Generator,
        device: &Device,
    ) -> Result<Tensor> {
        let n = shape.elem_count();
        let counter = generator.advance(n);
        let buffer = device.backend().rand(dtype, n, dist, generator.seed(), counter)?;
        Ok(Tensor::from_buffer(buffer, shape, device))
    }
    /// A tensor of the same shape, dtype and device filled with `value`.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(self.shape().clone(), value, self.dtype(), self.device())
    }
    /// A tensor of the same shape, dtype and device filled with 0, as `torch.zeros_like`.
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(0.0)
    }

    // --- accessors -------------------------------------------------------------------------------

    /// A process-unique id; clones share it, while views, detached tensors and `requires_grad` leaves get new ones.
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// The shape (dims) of this tensor.
    pub fn shape(&self) -> &Shape {
        &self.0.layout.shape
    }
    /// The size of each axis, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.0.layout.dims()
    }
    /// The number of axes (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.0.layout.shape.rank()
    }
    /// The total number of elements (the product of the dims).
    pub fn elem_count(&self) -> usize {
        self.0.layout.elem_count()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The device whose buffer holds the data.
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    /// The shape, strides and offset through which this tensor reads its buffer.
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    /// The shared device buffer; a view may cover only part of it, as described by [`Tensor::layout`].
    pub fn buffer(&self) -> &BufferRef {
        &self.0.buffer
    }
    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        self.0.device.backend()
    }
    /// True when the elements are laid out row-major without gaps (the offset may still be non-zero).
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// True when this tensor and `other` share the same storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.buffer, &other.0.buffer)
    }

    // --- host transfers (sync points) ------------------------------------------------------------

    /// The elements in row-major order. Waits for the device.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        T::from_host(self.to_host()?)
    }
    /// The elements in row-major order as a typed host vector of this tensor's dtype. Waits for the device.
    pub fn to_host(&self) -> Result<HostVec> {
        self.backend().to_host(&self.0.buffer, &self.0.layout)
    }
    /// Every element as f64, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }
    /// The single value of a one-element tensor, as f64. Waits for the device.
    pub fn item(&self) -> Result<f64> {
        if self.elem_count() != 1 {
            return Err(Error::invalid(
                "item",
                format!("needs exactly one element, the tensor has shape {}", self.shape()),
            ));
        }
        Ok(self.to_f64_vec()?[0])
    }

    // --- dtype, device, contiguity ---------------------------------------------------------------

    /// A copy with `dtype` (differentiable between float dtypes).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let buffer = self.backend().cast(&self.0.buffer, &self.0.layout, dtype)?;
        Ok(self.cast_from(buffer))
    }

    /// Each of `tensors` as `to_dtype(dtype)` gives it, the contiguous ones of each device cast
    /// in one `Backend::cast_copies` call (autocast's copies of a model's weights).
    pub(crate) fn to_dtype_all(tensors: &[Tensor], dtype: DType) -> Result<Vec<Tensor>> {
        let mut out: Vec<Option<Tensor>> = vec![None; tensors.len()];
        let mut batches: Vec<(Device, Vec<usize>)> = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            if t.dtype() == dtype || !t.fills_its_buffer() {
                out[i] = Some(t.to_dtype(dtype)?);
            } else if let Some((_, batch)) = batches.iter_mut().find(|(d, _)| d == t.device()) {
                batch.push(i);
            } else {
                batches.push((t.device().clone(), vec![i]));
            }
        }
        for (device, batch) in batches {
            let bufs: Vec<&BufferRef> = batch.iter().map(|&i| &tensors[i].0.buffer).collect();
            let cast = device.backend().cast_copies(&bufs, dtype)?;
            for (&i, buffer) in batch.iter().zip(cast) {
                out[i] = Some(tensors[i].cast_from(buffer));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// `buffer`, holding this tensor's elements cast to another dtype, as the differentiable
    /// result of `to_dtype`.
    fn cast_from(&self, buffer: BufferRef) -> Tensor {
        let dtype = buffer.dtype();
        let out = Tensor::from_buffer(buffer, self.shape().clone(), self.device());
        let from = self.dtype();
        let differentiable = from.is_float() && dtype.is_float();
        out.track("to_dtype", &[self], move |g| {
            Ok(vec![if differentiable { Some(g.to_dtype(from)?) } else { None }])
        })
    }

    /// A copy on `device` (differentiable: the gradient travels back).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        let out = Tensor::from_host(host, self.shape().clone(), device)?;
        let origin = self.device().clone();
        Ok(out.track("to_device", &[self], move |g| Ok(vec![Some(g.to_device(&origin)?)])))
    }

    /// Self if already contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.fills_its_buffer() {
            return Ok(self.clone());
        }
        let out = self.deep_copy()?;
        Ok(out.track("contiguous", &[self], |g| Ok(vec![Some(g.clone())])))
    }

    /// Whether this tensor is its whole buffer, in order: what a backend's whole-buffer ops take.
    fn fills_its_buffer(&self) -> bool {
        self.is_contiguous() && self.0.layout.offset == 0 && self.0.buffer.len() == self.elem_count()
    }

    /// A contiguous copy with its own buffer, cut from the graph.
    pub fn deep_copy(&self) -> Result<Tensor> {
        let buffer = self.backend().contiguous(&self.0.buffer, &self.0.layout)?;
        Ok(Tensor::from_buffer(buffer, self.shape().clone(), self.device()))
    }

    /// Overwrites this tensor's elements with `src`'s (same shape), outside the graph.
    /// For optimizer state, running statistics and loading checkpoints.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        self.same_device("assign", src)?;
        if self.shape() != src.shape() {
            return Err(Error::shape(
                "assign",
                self.shape(),
                src.shape(),
                "assign needs equal shapes",
            ));
        }
        if self.dtype() != src.dtype() {
            return Err(Error::DTypeMismatch {
                op: "assign",
                lhs: self.dtype(),
                rhs: src.dtype(),
            });
        }
        self.backend()
            .copy_strided(&src.0.buffer, &src.0.layout, &self.0.buffer, &self.0.layout)
    }

    // --- autograd --------------------------------------------------------------------------------

    /// A leaf sharing this storage that records gradients into `.grad` (for parameters).
    pub fn requires_grad(&self, requires: bool) -> Tensor {
        Tensor(Arc::new(Inner {
            id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
            buffer: self.0.buffer.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            grad_fn: None,
            requires_grad: requires,
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
        }))
    }
    /// True when gradients flow to or through this tensor.
    pub fn tracks_grad(&self) -> bool {
        self.0.requires_grad
    }
    /// True when no recorded op produced this tensor (parameters, inputs and detached tensors).
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }
    /// The recorded operation that produced this tensor, if any.
    pub(crate) fn node(&self) -> Option<&Arc<Node>> {
        self.0.grad_fn.as_ref()
    }
    /// The same storage, cut from the graph.
    pub fn detach(&self) -> Tensor {
        self.view(self.0.layout.clone())
    }
    /// The accumulated gradient of a leaf.
    pub fn grad(&self) -> Option<Tensor> {
        self.0.grad.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Replaces the accumulated gradient (`None` clears it), outside the graph.
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = grad;
    }
    /// Clears the accumulated gradient, as `tensor.grad = None` in PyTorch.
    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// Registers `hook` to run during each backward pass as soon as this leaf's gradient is
    /// final, while backward continues with the rest of the graph (data-parallel reducers
    /// start their all-reduce here).
    pub fn add_grad_ready_hook(&self, hook: GradReadyHook) {
        self.0.hooks.lock().unwrap_or_else(|e| e.into_inner()).push(hook);
    }

    pub(crate) fn run_grad_ready_hooks(&self) -> Result<()> {
        let hooks = self.0.hooks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        hooks.iter().try_for_each(|h| h(self))
    }

    pub(crate) fn accumulate_grad(&self, g: &Tensor) -> Result<()> {
        if g.shape() != self.shape() {
            return Err(Error::Autograd(format!(
                "gradient of shape {} for a parameter of shape {}",
                g.shape(),
                self.shape()
            )));
        }
        let mut slot = self.0.grad.lock().unwrap_or_else(|e| e.into_inner());
        let next = match slot.take() {
            // Keep the gradient's buffer only if nothing else holds it: `add` hands the same
            // gradient to both operands, and an in-place writer (clipping, unscaling, a DDP
            // bucket copy-back) must never change two parameters' gradients at once.
            None if Arc::strong_count(&g.0.buffer) == 1 => g.detach().contiguous()?,
            None => g.deep_copy()?,
            Some(prev) => {
                // Accumulate in place when the previous gradient is ours alone.
                let g = g.contiguous()?;
                // Fix: `axpy` is specified for f32 state only (f64 on the CPU); other dtypes (f16
                // leaves used twice) failed here, so they take the out-of-place path.
                let axpy_dtype = matches!(g.dtype(), DType::F32 | DType::F64);
                if axpy_dtype
                    && prev.is_contiguous()
                    && prev.dtype() == g.dtype()
                    && Arc::strong_count(&prev.0.buffer) == 1
                {
                    prev.backend().axpy(&prev.0.buffer, &g.0.buffer, 1.0)?;
                    prev
                } else {
                    prev.add(&g)?.detach()
                }
            }
        };
        *slot = Some(next);
        Ok(())
    }

    /// Computes the gradient of this scalar with respect to every leaf that requires grad.
    pub fn backward(&self) -> Result<()> {
        if self.elem_count() != 1 {
            return Err(Error::Autograd(format!(
                "backward() needs a scalar (one element), not shape {}; reduce it first, e.g. with mean_all()",
                self.shape()
            )));
        }
        let seed = self.ones_like()?;
        self.backward_with(seed)
    }

    /// Back-propagates `grad` (the gradient of some scalar with respect to self).
    pub fn backward_with(&self, grad: Tensor) -> Result<()> {
        match &self.0.grad_fn {
            Some(node) => autograd::backward(node, grad),
            None if self.0.requires_grad => {
                self.accumulate_grad(&grad)?;
                self.run_grad_ready_hooks()
            }
            None => Err(Error::Autograd(
                "this tensor does not depend on any tensor that requires grad".into(),
            )),
        }
    }

    fn ones_like(&self) -> Result<Tensor> {
        self.full_like(1.0)
    }

    /// Records the operation that produced `self` from `inputs` when the graph is on and any input
    /// needs a gradient. `backward` maps the output gradient to one optional gradient per input.
    pub(crate) fn track(
        self,
        name: &'static str,
        inputs: &[&Tensor],
        backward: impl FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
    ) -> Tensor {
        self.track_node(name, inputs, None, Backward::Maps(Box::new(backward)))
    }

    /// As `track`, `backward` also handed the gradient the first input's other uses had
    /// delivered when it runs (None if none had): the first gradient it returns must include it.
    pub(crate) fn track_absorbing(
        self,
        name: &'static str,
        inputs: &[&Tensor],
        backward: impl FnOnce(&Tensor, Option<Tensor>) -> Result<Vec<Option<Tensor>>> + Send + 'static,
    ) -> Tensor {
        self.track_node(name, inputs, None, Backward::Absorbs(Box::new(backward)))
    }

    /// As `track`, for a narrow view of `input` at `window`: the backward walk may join the
    /// gradients of views that tile an axis instead of running `backward` (which pads).
    pub(crate) fn track_window(
        self,
        name: &'static str,
        input: &Tensor,
        window: Window,
        backward: impl FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + 'static,
    ) -> Tensor {
        self.track_node(name, &[input], Some(window), Backward::Maps(Box::new(backward)))
    }

    fn track_node(self, name: &'static str, inputs: &[&Tensor], window: Option<Window>, backward: Backward) -> Tensor {
        if !autograd::is_grad_enabled() {
            autograd::capture::note(inputs);
            return self;
        }
        if !inputs.iter().any(|t| t.0.requires_grad) {
            return self;
        }
        let edges = inputs
            .iter()
            .map(|t| match (&t.0.grad_fn, t.0.requires_grad) {
                (Some(node), _) => Edge::Node(node.clone()),
                (None, true) => Edge::Leaf((*t).clone()),
                (None, false) => Edge::None,
            })
            .collect();
        let node = Node::new(name, edges, window, backward);
        let inner = Arc::try_unwrap(self.0).unwrap_or_else(|shared| Inner {
            id: NEXT_TENSOR.fetch_add(1, Ordering::Relaxed),
            buffer: shared.buffer.clone(),
            layout: shared.layout.clone(),
            dtype: shared.dtype,
            device: shared.device.clone(),
            grad_fn: None,
            requires_grad: false,
            grad: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
        });
        Tensor(Arc::new(Inner {
            grad_fn: Some(node),
            requires_grad: true,
            ..inner
        }))
    }

    // --- checks ----------------------------------------------------------------------------------

    pub(crate) fn same_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device() != other.device() {
            return Err(Error::DeviceMismatch {
                op,
                a: self.device().to_string(),
                b: other.device().to_string(),
            });
        }
        Ok(())
    }
    pub(crate) fn same_dtype(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: other.dtype(),
            });
        }
        Ok(())
    }
    pub(crate) fn float_only(&self, op: &'static str) -> Result<()> {
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype(),
                hint: "; convert with to_dtype(DType::F32) first",
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {}, {}", self.shape(), self.dtype(), self.device())?;
        if let Some(n) = &self.0.grad_fn {
            write!(f, ", grad_fn={}", n.name())?;
        }
        write!(f, ")")
    }
}
