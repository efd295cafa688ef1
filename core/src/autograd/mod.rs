//! Reverse-mode automatic differentiation over `Tensor` operations.
//!
//! Each operation that produces a tensor from inputs needing gradients records a `Node`: the
//! edges to its inputs and a one-shot closure that maps the output's gradient to the inputs'.
//! `backward()` walks the nodes in reverse topological order. A node's closure and saved tensors
//! are dropped as soon as it has run, so intermediate buffers are freed during the walk (and a
//! second `backward` through the same graph is an error, as in PyTorch). Gradients accumulate in
//! the `.grad` of leaf tensors created with `requires_grad` until `zero_grad`.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

mod pending;
use pending::Pending;
pub(crate) use pending::Window;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
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
    backward: BackwardFn,
}

static NEXT_NODE: AtomicU64 = AtomicU64::new(0);

impl Node {
    pub(crate) fn new(name: &'static str, edges: Vec<Edge>, window: Option<Window>, backward: BackwardFn) -> Arc<Node> {
        Arc::new(Node {
            id: NEXT_NODE.fetch_add(1, Ordering::Relaxed),
            name,
            window,
            state: Mutex::new(Some(NodeState { edges, backward })),
        })
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

/// Nodes reachable from `root`, parents before children, with each node's number of consumers.
fn topological_order(root: &Arc<Node>) -> Vec<Arc<Node>> {
    let mut consumers: HashMap<u64, usize> = HashMap::new();
    let mut seen: HashMap<u64, Arc<Node>> = HashMap::new();
    let mut stack = vec![root.clone()];
    seen.insert(root.id, root.clone());
    while let Some(n) = stack.pop() {
        for c in n.children() {
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
        for c in n.children() {
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

/// Back-propagates from `root` (whose gradient is `seed`) into the leaves' `.grad`. A leaf's
/// grad-ready hooks run as soon as the last edge into it has delivered (or skipped) its gradient,
/// while the rest of the walk continues: a data-parallel reducer starts communicating there.
pub(crate) fn backward(root: &Arc<Node>, seed: Tensor) -> Result<()> {
    let _no_grad = NoGradGuard::new();
    let order = topological_order(root);
    let mut pending: HashMap<u64, usize> = HashMap::new();
    for node in &order {
        for leaf in node.leaf_edges() {
            *pending.entry(leaf.id()).or_default() += 1;
        }
    }
    let mut grads: HashMap<u64, Pending> = HashMap::new();
    grads.insert(root.id, Pending::Whole(seed));
    for node in order {
        let Some(arrived) = grads.remove(&node.id) else {
            // No gradient reached this node: its leaves expect nothing more from it.
            for leaf in node.leaf_edges() {
                count_down(&mut pending, &leaf)?;
            }
            continue;
        };
        let state = node.state.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or_else(|| {
            Error::Autograd(format!(
                "the graph through `{}` was already used by an earlier backward(); run the forward pass again (each backward frees its graph)",
                node.name
            ))
        })?;
        if let (Some(window), [Edge::Node(input)]) = (&node.window, state.edges.as_slice()) {
            let delivered = Pending::add_piece(grads.remove(&input.id), window, arrived.into_tensor()?)?;
            grads.insert(input.id, delivered);
            continue;
        }
        let grad = arrived.into_tensor()?;
        let input_grads = (state.backward)(&grad)?;
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
                (Edge::Node(n), Some(g)) => {
                    let delivered = Pending::add_whole(grads.remove(&n.id), g)?;
                    grads.insert(n.id, delivered);
                }
                (Edge::Leaf(leaf), g) => {
                    if let Some(g) = &g {
                        leaf.accumulate_grad(g)?;
                    }
                    count_down(&mut pending, &leaf)?;
                }
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
