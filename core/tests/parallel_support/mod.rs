//! Helpers shared by the data-parallel tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use lockstep_core::backend::cpu::CpuBackend;
use lockstep_core::backend::{BufferRef, Communicator, LocalCommunicator, ReduceOp};
use lockstep_core::{Device, Result};

/// Runs `body(device, comm)` for every rank of a group on the CPU virtual devices cpu:0,
/// cpu:1, …, one thread each; the results in rank order.
pub fn on_cpu_ranks<T: Send + 'static>(
    world: usize,
    body: impl Fn(Device, LocalCommunicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    on_cpu_ranks_with_timeout(world, Duration::from_secs(600), body)
}

/// `on_cpu_ranks` whose collectives fail after `timeout` (a test of ranks falling out of step
/// then fails fast instead of waiting out the 10-minute default).
pub fn on_cpu_ranks_with_timeout<T: Send + 'static>(
    world: usize,
    timeout: Duration,
    body: impl Fn(Device, LocalCommunicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let devices: Vec<Device> = (0..world)
        .map(|i| Device::parse(&format!("cpu:{i}")).unwrap())
        .collect();
    on_ranks_of(devices, timeout, body)
}

/// `on_cpu_ranks` on CPU devices of their own, whose memory counts only this test's tensors
/// (`cpu:N` is shared by the tests running beside it).
pub fn on_fresh_cpu_ranks<T: Send + 'static>(
    world: usize,
    body: impl Fn(Device, LocalCommunicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let devices = (0..world)
        .map(|i| Device::from_backend(Arc::new(CpuBackend::new(i))))
        .collect();
    on_ranks_of(devices, Duration::from_secs(600), body)
}

fn on_ranks_of<T: Send + 'static>(
    devices: Vec<Device>,
    timeout: Duration,
    body: impl Fn(Device, LocalCommunicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let comms = LocalCommunicator::group_with_timeout(devices.iter().map(|d| d.backend().clone()).collect(), timeout);
    let body = Arc::new(body);
    let threads: Vec<_> = comms
        .into_iter()
        .zip(devices)
        .map(|(comm, device)| {
            let body = body.clone();
            std::thread::spawn(move || body(device, comm))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

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
