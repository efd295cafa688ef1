//! The CPU device's memory. A tensor the machine cannot hold is refused before it is allocated:
//! past the machine's memory, Rust's allocator aborts the process, or the kernel kills it
//! part-way through a run, where an error could have said what to change.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The memory a CPU device may fill: RAM and swap (`/proc/meminfo`), read once; unknown (no
/// check) where there is no such file; and below it the limit a program set, if any.
#[derive(Debug)]
pub struct Capacity {
    ram: Option<u64>,
    swap: u64,
    /// `Backend::set_memory_limit`'s bytes; 0 for none.
    limit: AtomicU64,
}

impl Capacity {
    pub fn of_this_machine() -> Capacity {
        let (ram, swap) = crate::limits::ram_and_swap();
        Capacity {
            ram,
            swap,
            limit: AtomicU64::new(0),
        }
    }

    /// Caps the live tensors' bytes at `limit` (None: the machine's memory alone).
    pub fn set_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(0), Ordering::Relaxed);
    }

    /// The most bytes live tensors may hold: the limit, or RAM and swap; None when unknown.
    fn bytes(&self) -> Option<u64> {
        let machine = self.ram.map(|ram| ram + self.swap);
        match self.limit.load(Ordering::Relaxed) {
            0 => machine,
            limit => Some(machine.map_or(limit, |m| m.min(limit))),
        }
    }

    /// The machine's RAM, as `DeviceInfo::total_memory_bytes` reports it.
    pub fn ram(&self) -> Option<u64> {
        self.ram
    }

    /// `len` elements of `dtype` asked by `op` on `cpu:{ordinal}` with `in_use` bytes live:
    /// refused when they cannot fit beside what is live. (The device is named only in the
    /// refusal: this runs for every new tensor.)
    pub fn check(&self, ordinal: usize, op: &'static str, dtype: DType, len: usize, in_use: u64) -> Result<()> {
        let requested = (len as u64).saturating_mul(dtype.size_in_bytes() as u64);
        self.check_bytes(ordinal, op, requested, in_use)
    }

    /// As `check`, for `requested` bytes.
    pub fn check_bytes(&self, ordinal: usize, op: &'static str, requested: u64, in_use: u64) -> Result<()> {
        let Some(capacity) = self.bytes() else { return Ok(()) };
        if requested.saturating_add(in_use) > capacity {
            return Err(Error::OutOfMemory {
                device: format!("cpu:{ordinal}"),
                op,
                requested,
                in_use,
                capacity,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_past_ram_and_swap_is_refused_naming_the_sizes() {
        let capacity = Capacity {
            ram: Some(8 << 30),
            swap: 2 << 30,
            limit: AtomicU64::new(0),
        };
        capacity.check(0, "rand", DType::F32, 1 << 30, 0).unwrap();
        // 784 x 1e9 f32: the weight of `--hidden 1000000000`.
        let err = capacity
            .check(0, "rand", DType::F32, 784_000_000_000, 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "cpu:0: rand asks for 2921 GiB, with 1.00 MiB in use, more than the 10 GiB the device may hold"
            ),
            "{err}"
        );
        for hint in [
            "--batch-size",
            "--accumulate",
            "--activation-checkpointing",
            "--zero 2",
            "bf16-mixed",
        ] {
            assert!(err.contains(hint), "{err} lacks {hint}");
        }
        // What is live counts: two halves that fit alone do not fit together.
        assert!(capacity.check(0, "full", DType::F32, 1 << 30, 7 << 30).is_err());
        assert!(
            capacity.check(0, "full", DType::F32, usize::MAX, 0).is_err(),
            "no overflow"
        );
        // A limit below the machine's memory is what counts.
        capacity.set_limit(Some(1 << 20));
        let err = capacity
            .check_bytes(0, "matmul", 1 << 20, 4096)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cpu:0: matmul asks for 1.00 MiB, with 4.00 KiB in use"),
            "{err}"
        );
        capacity.set_limit(None);
        capacity.check_bytes(0, "matmul", 1 << 20, 4096).unwrap();
    }
}
