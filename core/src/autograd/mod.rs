//! Reverse-mode automatic differentiation over `Tensor` operations.
//!
//! Each operation that produces a tensor from inputs needing gradients records a `Node`: the
//! edges to its inputs and a one-shot closure that maps the output's gradient to the inputs'.
//! `backward()` walks the nodes in reverse topological order. A node's closure and saved tensors
//! are dropped as soon as it has run, so intermediate buffers are freed during the walk (and a
//! second `backward` through the same graph is an error, as in PyTorch). Gradients accumulate in
//! the `.grad` of leaf tensors created with `requires_grad` until `zero_grad`. A node may absorb
//! (`Backward::Absorbs`): it is handed the gradient its first input's other uses delivered and
//! returns the sum, so a backend adds the two in the pass that computes its own share.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub(crate) mod capture;
mod gradients;
mod pending;
pub(crate) use gradients::gradients;
use pending::Pending;
pub(crate) use pending::Window;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static RECOMPUTING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is re-running a checkpointed block's forward during backward. A layer
/// with side effects in its forward skips them then (BatchNorm's running statistics already
/// took this batch in the first forward).
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get())
}

/// Runs `f` as a checkpoint's recompute (see [`is_recomputing`]).
pub(crate) fn recomputing<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            RECOMPUTING.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(RECOMPUTING.with(|r| r.replace(true)));
    f()
}

/// Whether operations on this thread record the graph.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Runs `f` without recording the graph (evaluation, optimizer updates, metrics).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _guard = NoGradGuard::new();
    f()
}

/// Runs `f` recording the graph, whatever the caller's setting (a checkpoint's recompute, which
/// runs inside the backward walk).
pub(crate) fn with_grad<R>(f: impl FnOnce() -> R) -> R {
    // A NoGradGuard puts back whatever setting it found, here the caller's.
    let _restore = NoGradGuard {
        previous: GRAD_ENABLED.with(|g| g.replace(true)),
    };
    f()
}

/// Disables graph recording until dropped.
pub struct NoGradGuard {
    previous: bool,
}

impl NoGradGuard {
    /// Turns graph recording off on this thread (as `torch.no_grad()`); dropping the guard restores the
    /// previous setting.
    pub fn new() -> Self {
        NoGradGuard {
            previous: GRAD_ENABLED.with(|g| g.replace(false)),
        }
    }
}

impl Default for NoGradGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Maps the gradient of an operation's output to the gradients of its inputs (None: no gradient).
pub(crate) type BackwardFn = Box<dyn FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send>;

/// As `BackwardFn`, also handed the gradient that the first input's other uses had delivered
/// when this node runs (taken out of the walk): the first gradient it returns includes it, so a
/// backend adds the two in the same pass that computes this node's share instead of the walk
/// adding them after (LayerNorm on the residual stream, whose other use's gradient arrives first).
pub(crate) type AbsorbingFn = Box<dyn FnOnce(&Tensor, Option<Tensor>) -> Result<Vec<Option<Tensor>>> + Send>;

/// A node's backward closure.
pub(crate) enum Backward {
    /// Output gradient to input gradients.
    Maps(BackwardFn),
    /// The same, the first input's delivered gradient folded in.
    Absorbs(AbsorbingFn),
}

/// Where an input's gradient goes.
pub(crate) enum Edge {
    /// Produced by another recorded operation.
    Node(Arc<Node>),
    /// A leaf that requires grad: the gradient accumulates in its `.grad`.
    Leaf(Tensor),
    /// Needs no gradient.
    None,
}

/// One recorded operation in the autograd graph (PyTorch's `grad_fn`): its name and, until backward
/// runs it, the edges to its inputs and its backward closure.
pub(crate) struct Node {
    id: u64,
    name: &'static str,
    /// Set for a narrow view: where it sits in its input, so the walk can hand the view's
    /// gradient to the input as a piece instead of running the padding closure.
    window: Option<Window>,
    state: Mutex<Option<NodeState>>,
}

struct NodeState {
    edges: Vec<Edge>,
    backward: Backward,
}

static NEXT_NODE: AtomicU64 = AtomicU64::new(0);

impl Node {
    pub(crate) fn new(name: &'static str, edges: Vec<Edge>, window: Option<Window>, backward: Backward) -> Arc<Node> {
        Arc::new(Node {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            name,
            window,
            state: Mutex::new(Some(NodeState { edges, backward })),
        })
    }
    /// The id the next recorded node gets: nodes recorded from now on have this id or a greater one.
    pub(crate) fn next_id() -> u64 {
        NEXT_NODE.load(Ordering::Relaxed)
    }
    /// The operation's name (`conv2d`, `gather`, …), which a tensor's `Debug` output shows as `grad_fn=`.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The leaves this node sends gradients to, once per edge.
    fn leaf_edges(&self) -> Vec<Tensor> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.as_ref().map_or_else(Vec::new, |s| {
            s.edges
                .iter()
                .filter_map(|e| if let Edge::Leaf(t) = e { Some(t.clone()) } else { None })
                .collect()
        })
    }
    fn children(&self) -> Vec<Arc<Node>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.as_ref().map_or_else(Vec::new, |s| {
            s.edges
                .iter()
                .filter_map(|e| if let Edge::Node(n) = e { Some(n.clone()) } else { None })
                .collect()
        })
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({} #{})", self.name, self.id)
    }
}

/// Nodes reachable from `root` without entering nodes recorded before `first` (an outer graph's),
/// parents before children.
fn topological_order(root: &Arc<Node>, first: u64) -> Vec<Arc<Node>> {
    let inner_children = |n: &Arc<Node>| n.children().into_iter().filter(|c| c.id >= first);
    let mut consumers: HashMap<u64, usize> = HashMap::new();
    let mut seen: HashMap<u64, Arc<Node>> = HashMap::new();
    let mut stack = vec![root.clone()];
    seen.insert(root.id, root.clone());
    while let Some(n) = stack.pop() {
        for c in inner_children(&n) {
            *consumers.entry(c.id).or_default() += 1;
            if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(c.id) {
                e.insert(c.clone());
                stack.push(c);
            }
        }
    }
    // Kahn: a node is ready once every consumer has passed its gradient on.
    let mut order = Vec::with_capacity(seen.len());
    let mut ready = vec![root.clone()];
    while let Some(n) = ready.pop() {
        for c in inner_children(&n) {
            let left = consumers.get_mut(&c.id).expect("counted above");
            *left -= 1;
            if *left == 0 {
                ready.push(c);
            }
        }
        order.push(n);
    }
    order
}

/// Where the walk's gradients end: what it does with a leaf's gradient and with one for a node
/// recorded before `first` (which it does not enter).
trait Ends {
    /// Nodes with smaller ids belong to an outer graph: the walk stops at them.
    fn first(&self) -> u64;
    /// Every node the walk will visit, before it starts.
    fn start(&mut self, order: &[Arc<Node>]);
    /// One edge into `leaf` is done, with its gradient or none.
    fn leaf(&mut self, leaf: &Tensor, grad: Option<Tensor>) -> Result<()>;
    /// A gradient for a node of the outer graph.
    fn outer(&mut self, node: &Arc<Node>, grad: Tensor) -> Result<()>;
}

/// Back-propagates from `root` (whose gradient is `seed`) into the leaves' `.grad`. A leaf's
/// grad-ready hooks run as soon as the last edge into it has delivered (or skipped) its gradient,
/// while the rest of the walk continues: a data-parallel reducer starts communicating there.
pub(crate) fn backward(root: &Arc<Node>, seed: Tensor) -> Result<()> {
    walk(root, seed, &mut IntoLeaves::default())
}

/// `backward`'s ends: gradients accumulate in the leaves, whose hooks run when their last edge is done.
#[derive(Default)]
struct IntoLeaves {
    /// Edges into each leaf not yet done.
    pending: HashMap<u64, usize>,
}

impl Ends for IntoLeaves {
    fn first(&self) -> u64 {
        0
    }
    fn start(&mut self, order: &[Arc<Node>]) {
        for node in order {
            for leaf in node.leaf_edges() {
                *self.pending.entry(leaf.id()).or_default() += 1;
            }
        }
    }
    fn leaf(&mut self, leaf: &Tensor, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            leaf.accumulate_grad(g)?;
        }
        count_down(&mut self.pending, leaf)
    }
    fn outer(&mut self, node: &Arc<Node>, _grad: Tensor) -> Result<()> {
        Err(Error::Autograd(format!("`{}` lies outside the whole graph", node.name)))
    }
}

/// The walk from `root` in reverse topological order, handing what reaches the ends to `ends`.
fn walk(root: &Arc<Node>, seed: Tensor, ends: &mut dyn Ends) -> Result<()> {
    let _no_grad = NoGradGuard::new();
    let first = ends.first();
    let order = topological_order(root, first);
    ends.start(&order);
    let mut grads: HashMap<u64, Pending> = HashMap::new();
    grads.insert(root.id, Pending::Whole(seed));
    for node in order {
        let Some(arrived) = grads.remove(&node.id) else {
            // No gradient reached this node: its leaves expect nothing more from it.
            for leaf in node.leaf_edges() {
                ends.leaf(&leaf, None)?;
            }
            continue;
        };
        let state = node.state.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or_else(|| {
            Error::Autograd(format!(
                "the graph through `{}` was already used by an earlier backward(); run the forward pass again (each backward frees its graph)",
                node.name
            ))
        })?;
        if let (Some(window), [Edge::Node(input)]) = (&node.window, state.edges.as_slice())
            && input.id >= first
        {
            let delivered = Pending::add_piece(grads.remove(&input.id), window, arrived.into_tensor()?)?;
            grads.insert(input.id, delivered);
            continue;
        }
        let grad = arrived.into_tensor()?;
        let input_grads = match state.backward {
            Backward::Maps(backward) => backward(&grad)?,
            Backward::Absorbs(backward) => {
                let absorbed = match state.edges.first() {
                    Some(Edge::Node(input)) if input.id >= first => {
                        grads.remove(&input.id).map(Pending::into_tensor).transpose()?
                    }
                    _ => None,
                };
                // Kept so that a closure that returns no first gradient cannot lose it.
                let kept = absorbed.clone();
                let mut input_grads = backward(&grad, absorbed)?;
                if let (Some(first), Some(kept)) = (input_grads.first_mut(), kept)
                    && first.is_none()
                {
                    *first = Some(kept);
                }
                input_grads
            }
        };
        drop(grad);
        if input_grads.len() != state.edges.len() {
            return Err(Error::Autograd(format!(
                "`{}` returned {} gradients for {} inputs",
                node.name,
                input_grads.len(),
                state.edges.len()
            )));
        }
        for (edge, g) in state.edges.into_iter().zip(input_grads) {
            match (edge, g) {
                (Edge::Node(n), Some(g)) if n.id < first => ends.outer(&n, g)?,
                (Edge::Node(n), Some(g)) => {
                    let delivered = Pending::add_whole(grads.remove(&n.id), g)?;
                    grads.insert(n.id, delivered);
                }
                (Edge::Leaf(leaf), g) => ends.leaf(&leaf, g)?,
                _ => {}
            }
        }
    }
    Ok(())
}

/// One edge into `leaf` is done; when it was the last, the leaf's hooks run (also when no
/// gradient reached it: a reducer must know that a parameter is unused this step).
fn count_down(pending: &mut HashMap<u64, usize>, leaf: &Tensor) -> Result<()> {
    let Some(left) = pending.get_mut(&leaf.id()) else {
        return Ok(());
    };
    *left -= 1;
    if *left > 0 {
        return Ok(());
    }
    pending.remove(&leaf.id());
    leaf.run_grad_ready_hooks()
}
