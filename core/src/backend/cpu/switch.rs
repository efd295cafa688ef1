//! One device's choice between two paths (fused attention or composed), which starts at the
//! process's default and which tests and benchmarks turn to compare the paths on one machine.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug)]
pub struct Switch(AtomicBool);

impl Switch {
    pub fn new(on: bool) -> Switch {
        Switch(AtomicBool::new(on))
    }
    pub fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}
