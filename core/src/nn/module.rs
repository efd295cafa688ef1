//! The `Module` trait and what every module gets from it.

use std::any::Any;
use std::sync::Arc;

use crate::autograd::no_grad;
use crate::backend::{Communicator, UnaryOp};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A module as `&dyn Any`, so a strategy can ask whether a model is the kind it drives (a
/// pipeline needs a `StagedModel`); every `'static` type has it.
pub trait AsAny {
    /// This value as `&dyn Any`, for `downcast_ref` to its concrete type.
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A layer or a model. Parameters are leaf tensors with `requires_grad`; an optimizer updates
/// them in place, so the module and the optimizer see the same storage.
pub trait Module: AsAny + Send + Sync {
    /// Runs the module on `x`, as PyTorch's `forward`; each layer documents the shapes it takes and returns.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Runs the module on several inputs, as a PyTorch `forward(self, a, b)`: the built-in tasks
    /// pass a batch's fields but the last (the labels). A module of one input takes exactly one;
    /// a model of several derives `Module` with `#[module(inputs)]` and writes its inherent
    /// `fn forward(&self, inputs: &[Tensor])`.
    fn forward_inputs(&self, inputs: &[Tensor]) -> Result<Tensor> {
        match inputs {
            [x] => self.forward(x),
            _ => Err(Error::invalid(
                "forward",
                format!(
                    "the model takes one input but the batch gives it {}; a model of several inputs derives \
                     Module with #[module(inputs)] and takes them as `forward(&self, inputs: &[Tensor])`",
                    inputs.len()
                ),
            )),
        }
    }

    /// Calls `f(name, tensor)` for each trainable parameter, in registration order, with
    /// PyTorch's dotted name under `prefix` (e.g. prefix "0." gives "0.weight").
    fn visit_parameters(&self, _prefix: &str, _f: &mut dyn FnMut(String, &Tensor)) {}

    /// Calls `f(name, tensor)` for each non-trainable buffer (running statistics, counters).
    fn visit_buffers(&self, _prefix: &str, _f: &mut dyn FnMut(String, &Tensor)) {}

    /// Calls `f` for every parameter and buffer in PyTorch's `state_dict` order: a module's own
    /// parameters, then its own buffers, then each child's. Containers override this to visit
    /// child by child; the default suits a module without children.
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.visit_parameters(prefix, f);
        self.visit_buffers(prefix, f);
    }

    /// Replaces every parameter and buffer with `f`'s result (`to_device` moves a module this
    /// way); containers recurse. Every module that holds tensors implements it: `to_device`
    /// checks that none stayed behind.
    fn map_tensors(&mut self, _f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        Ok(())
    }

    /// Switches training behaviour (dropout, batch statistics) on or off.
    fn set_training(&mut self, _training: bool) {}

    /// Calls `f` for each random stream the module draws from (Dropout's), so the Trainer
    /// checkpoints and restores them without the user threading them anywhere; containers
    /// recurse. A stream shared by several layers is reported by each.
    fn visit_generators(&self, _f: &mut dyn FnMut(&Arc<Generator>)) {}

    /// Replaces batch statistics with ones synchronised across the replicas of `comm` (PyTorch's
    /// `SyncBatchNorm.convert_sync_batchnorm`): BatchNorm layers keep `comm`, containers forward
    /// it to their children, other modules ignore it. Call it before creating the gradient
    /// reducer, with a communicator of its own (its collectives must not interleave with the
    /// reducer's).
    fn convert_sync_batchnorm(&mut self, _comm: &Arc<dyn Communicator>) {}

    /// A one-line description, as PyTorch prints it: `Linear(in_features=784, out_features=512, bias=True)`.
    fn describe(&self) -> String;

    /// The elementwise function this module is, when it is a plain activation (ReLU, GELU): a
    /// `Sequential` offers it to the layer before, which may fuse it into its own output pass.
    fn activation(&self) -> Option<UnaryOp> {
        None
    }

    /// `forward` followed by `act`, fused where the layer can (Linear and Conv2d apply bias and
    /// activation in one device pass); None when it cannot, and the caller runs them apart.
    fn forward_activated(&self, _x: &Tensor, _act: UnaryOp) -> Option<Result<Tensor>> {
        None
    }
}

/// `*t = f(t)`, for `map_tensors`.
pub fn remap(t: &mut Tensor, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
    *t = f(t)?;
    Ok(())
}

/// `remap` of an optional tensor (a bias).
pub(crate) fn remap_opt(t: &mut Option<Tensor>, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
    t.as_mut().map_or(Ok(()), |t| remap(t, f))
}

/// How PyTorch prints a module with children: `Kind(` then one `(name): child` line each (a
/// child's own lines indented under it), then `)`; `Kind()` without children.
pub fn describe_tree(kind: &str, children: &[(String, String)]) -> String {
    if children.is_empty() {
        return format!("{kind}()");
    }
    let lines: Vec<String> = children
        .iter()
        .map(|(name, text)| format!("  ({name}): {}", text.replace('\n', "\n  ")))
        .collect();
    format!("{kind}(\n{}\n)", lines.join("\n"))
}

/// A boxed module is a module: containers and derived models hold children this way.
impl Module for Box<dyn Module> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.as_ref().forward(x)
    }
    fn forward_inputs(&self, inputs: &[Tensor]) -> Result<Tensor> {
        self.as_ref().forward_inputs(inputs)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.as_ref().visit_parameters(prefix, f)
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.as_ref().visit_buffers(prefix, f)
    }
    fn visit_state(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.as_ref().visit_state(prefix, f)
    }
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        self.as_mut().map_tensors(f)
    }
    fn set_training(&mut self, training: bool) {
        self.as_mut().set_training(training)
    }
    fn visit_generators(&self, f: &mut dyn FnMut(&Arc<Generator>)) {
        self.as_ref().visit_generators(f)
    }
    fn convert_sync_batchnorm(&mut self, comm: &Arc<dyn Communicator>) {
        self.as_mut().convert_sync_batchnorm(comm)
    }
    fn describe(&self) -> String {
        self.as_ref().describe()
    }
    fn activation(&self) -> Option<UnaryOp> {
        self.as_ref().activation()
    }
    fn forward_activated(&self, x: &Tensor, act: UnaryOp) -> Option<Result<Tensor>> {
        self.as_ref().forward_activated(x, act)
    }
}

/// `prefix` + `name`, the dotted naming of nested modules.
pub(crate) fn join_name(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

/// Conveniences every module has.
pub trait ModuleExt: Module {
    /// The random streams the module draws from, each once, in the order first met.
    fn generators(&self) -> Vec<Arc<Generator>> {
        let mut out: Vec<Arc<Generator>> = Vec::new();
        self.visit_generators(&mut |g| {
            if !out.iter().any(|o| Arc::ptr_eq(o, g)) {
                out.push(g.clone());
            }
        });
        out
    }

    /// Named parameters in registration order; a tensor two layers hold (a tied weight) comes
    /// once, under its first name, as PyTorch's `named_parameters` leaves out duplicates.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        self.visit_parameters("", &mut |n, t| {
            if seen.insert(t.id()) {
                out.push((n, t.clone()))
            }
        });
        out
    }
    /// The trainable parameters in registration order, without names (what an optimizer takes).
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }
    /// Named buffers (running statistics, counters) in registration order.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_buffers("", &mut |n, t| out.push((n, t.clone())));
        out
    }
    /// Parameters and buffers in PyTorch's `state_dict()` order. The tensors share storage
    /// with the module: serialise them before the next update if a snapshot is needed.
    fn state_dict(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit_state("", &mut |n, t| out.push((n, t.clone())));
        out
    }
    /// Copies `state` into this module's parameters and buffers in place (PyTorch's strict
    /// `load_state_dict`), converting dtype and device where they differ. Nothing is written
    /// unless every name matches and every shape agrees; the error lists all problems.
    fn load_state_dict(&self, state: &[(String, Tensor)]) -> Result<()> {
        super::state_dict::load(&self.state_dict(), state)
    }
    /// Saves the parameters and buffers under their PyTorch names as one safetensors file,
    /// written atomically: `model.load_state_dict(safetensors.torch.load_file(path))` reads it.
    fn save(&self, path: &std::path::Path) -> Result<()>
    where
        Self: Sized,
    {
        super::weights::save(self, path)
    }
    /// Loads the weights in `path` (a file `save` or PyTorch wrote, or a Lockstep checkpoint,
    /// whose optimizer part is left out), strictly: every name must match both ways, and
    /// nothing is written otherwise. The error lists every missing, unexpected or misshapen name.
    fn load(&self, path: &std::path::Path) -> Result<()>
    where
        Self: Sized,
    {
        super::weights::load(self, path, true).map(|_| ())
    }
    /// As `load`, but loads the names both sides have and reports the rest, as PyTorch's
    /// `load_state_dict(strict=False)` does (a shape that differs is still an error).
    fn load_non_strict(&self, path: &std::path::Path) -> Result<super::LoadReport>
    where
        Self: Sized,
    {
        super::weights::load(self, path, false)
    }
    /// Total element count of all parameters, as `sum(p.numel() for p in model.parameters())`.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Tensor::elem_count).sum()
    }
    /// Switches to training mode (dropout on, batch statistics), as PyTorch's `module.train()`.
    fn train(&mut self) {
        self.set_training(true)
    }
    /// Switches to evaluation mode (dropout off, running statistics), as PyTorch's `module.eval()`.
    fn eval(&mut self) {
        self.set_training(false)
    }
    /// Clears every parameter's gradient (to `None`), as PyTorch's `zero_grad(set_to_none=True)`.
    fn zero_grad(&self) {
        self.parameters().iter().for_each(Tensor::zero_grad)
    }
    /// Moves every parameter and buffer to `device` (PyTorch's `module.to(device)`); parameters
    /// stay leaves that require grad, and a tensor two layers hold (a tied weight) stays one
    /// tensor. Build the optimizer after moving: it holds the tensors.
    fn to_device(&mut self, device: &Device) -> Result<()> {
        let mut moved_before: std::collections::HashMap<u64, Tensor> = std::collections::HashMap::new();
        no_grad(|| {
            self.map_tensors(&mut |t| {
                if let Some(moved) = moved_before.get(&t.id()) {
                    return Ok(moved.clone());
                }
                let moved = t.to_device(device)?.detach();
                let moved = if t.tracks_grad() {
                    moved.requires_grad(true)
                } else {
                    moved
                };
                moved_before.insert(t.id(), moved.clone());
                Ok(moved)
            })
        })?;
        match self.state_dict().into_iter().find(|(_, t)| t.device() != device) {
            Some((name, t)) => Err(Error::invalid(
                "to_device",
                format!(
                    "{name} stayed on {}: its module does not implement map_tensors",
                    t.device()
                ),
            )),
            None => Ok(()),
        }
    }
}

impl<M: Module + ?Sized> ModuleExt for M {}
