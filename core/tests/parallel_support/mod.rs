//! Helpers shared by the data-parallel tests.
#![allow(dead_code)]

use std::sync::Arc;

use lockstep_core::Result;
use lockstep_core::backend::{BufferRef, Communicator, ReduceOp};

/// A communicator that calls `before_all_reduce` ahead of each all-reduce (to count or hold
/// them) and forwards everything to `inner`.
pub struct Intercepted {
    pub inner: Arc<dyn Communicator>,
    pub before_all_reduce: Box<dyn Fn() + Send + Sync>,
}

impl Communicator for Intercepted {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()> {
        (self.before_all_reduce)();
        self.inner.all_reduce(buf, op)
    }
    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        self.inner.broadcast(buf, root)
    }
    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()> {
        self.inner.all_gather(input, output)
    }
    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()> {
        self.inner.reduce_scatter(input, output, op)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
}
