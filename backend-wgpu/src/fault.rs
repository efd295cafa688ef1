//! Fault injection: the failures a real driver produces rarely (a reset during a wait, freed
//! memory that comes back only after a poll) made to happen on demand, so the code that handles
//! them runs in CI on lavapipe.

use std::sync::atomic::{AtomicBool, Ordering};

/// A failure to inject with `WgpuBackend::inject_fault` (tests only).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The device is destroyed: wgpu's own lost-device path, reported by its lost callback.
    Destroyed,
    /// A driver reset during the next wait: the device is destroyed and every poll from the
    /// next on panics, as wgpu 30's `Device::poll` does when a fence wait fails with Lost.
    ResetDuringWait,
    /// Buffer creation reports out of memory until the next completed wait, as when the memory
    /// that would fit is held by dropped buffers wgpu frees only once their work is done and the
    /// device is polled.
    MemoryHeldUntilWait,
}

/// The armed faults of one device.
#[derive(Default)]
pub struct Faults {
    reset_during_wait: AtomicBool,
    memory_held_until_wait: AtomicBool,
}

impl Faults {
    pub fn arm(&self, fault: Fault) {
        match fault {
            Fault::Destroyed => {}
            Fault::ResetDuringWait => self.reset_during_wait.store(true, Ordering::Relaxed),
            Fault::MemoryHeldUntilWait => self.memory_held_until_wait.store(true, Ordering::Relaxed),
        }
    }

    /// Whether polls fail as after a driver reset.
    pub fn reset(&self) -> bool {
        self.reset_during_wait.load(Ordering::Relaxed)
    }

    pub fn memory_held(&self) -> bool {
        self.memory_held_until_wait.load(Ordering::Relaxed)
    }

    /// A wait completed: memory held until then is free.
    pub fn waited(&self) {
        self.memory_held_until_wait.store(false, Ordering::Relaxed);
    }
}
