//! The tensors a checkpoint's forward uses from outside it. That forward runs without recording
//! the graph, so the ops report their inputs that need a gradient here instead (parameters,
//! activations the block's closure captured): the checkpoint's node takes them as its edges, so
//! the backward walk counts every parameter's edges before it starts and runs its hooks once.

use std::cell::RefCell;

use crate::tensor::Tensor;

thread_local! {
    /// One list per checkpoint forward in progress on this thread, innermost last.
    static USED: RefCell<Vec<Vec<Tensor>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` and returns, with its result, the tensors needing a gradient that its ops read
/// while the graph was off, each once, in the order first read.
pub(crate) fn capture_used<R>(f: impl FnOnce() -> R) -> (R, Vec<Tensor>) {
    USED.with(|u| u.borrow_mut().push(Vec::new()));
    let frame = Frame;
    let out = f();
    (out, frame.finish())
}

/// This capture's list on the stack; dropped without `finish` (a panic in the forward) it
/// still comes off, so later forwards on this thread capture nothing stale.
struct Frame;

impl Frame {
    fn finish(self) -> Vec<Tensor> {
        std::mem::forget(self);
        USED.with(|u| u.borrow_mut().pop()).unwrap_or_default()
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        USED.with(|u| u.borrow_mut().pop());
    }
}

/// Whether a checkpoint's forward is running on this thread (autocast then caches no casts:
/// a cast made without the graph must not serve the recorded ops after it).
pub(crate) fn is_capturing() -> bool {
    USED.with(|u| !u.borrow().is_empty())
}

/// Called by every op that ran without recording: notes its `inputs` that need a gradient.
pub(crate) fn note(inputs: &[&Tensor]) {
    USED.with(|u| {
        let mut u = u.borrow_mut();
        let Some(used) = u.last_mut() else { return };
        for t in inputs.iter().filter(|t| t.tracks_grad()) {
            if !used.iter().any(|seen| seen.id() == t.id()) {
                used.push((*t).clone());
            }
        }
    })
}
