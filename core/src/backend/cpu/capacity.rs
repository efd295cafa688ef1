//! The CPU device's memory. A tensor the machine cannot hold is refused before it is allocated:
//! past the machine's memory, Rust's allocator aborts the process, or the kernel kills it
//! part-way through a run, where an error could have said what to change.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The memory a CPU device may fill: RAM and swap (`/proc/meminfo`), read once; unknown (no
/// check) where there is no such file.
#[derive(Debug)]
pub struct Capacity {
    ram: Option<u64>,
    swap: u64,
}

impl Capacity {
    pub fn of_this_machine() -> Capacity {
        let (ram, swap) = crate::limits::ram_and_swap();
        Capacity { ram, swap }
    }

    /// The machine's RAM, as `DeviceInfo::total_memory_bytes` reports it.
    pub fn ram(&self) -> Option<u64> {
        self.ram
    }

    /// `len` elements of `dtype` asked by `op` on `cpu:{ordinal}` with `in_use` bytes live:
    /// refused when they cannot fit beside what is live. (The device is named only in the
    /// refusal: this runs for every new tensor.)
    pub fn check(&self, ordinal: usize, op: &'static str, dtype: DType, len: usize, in_use: u64) -> Result<()> {
        let Some(ram) = self.ram else { return Ok(()) };
        let capacity = ram + self.swap;
        let requested = (len as u64).saturating_mul(dtype.size_in_bytes() as u64);
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
        };
        capacity.check(0, "rand", DType::F32, 1 << 30, 0).unwrap();
        // 784 x 1e9 f32: the weight of `--hidden 1000000000`.
        let err = capacity
            .check(0, "rand", DType::F32, 784_000_000_000, 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cpu:0: rand asks for 2921 GiB, with 0.00 GiB in use, more than the device's 10 GiB"),
            "{err}"
        );
        assert!(err.contains("try a smaller model or batch"), "{err}");
        // What is live counts: two halves that fit alone do not fit together.
        assert!(capacity.check(0, "full", DType::F32, 1 << 30, 7 << 30).is_err());
        assert!(
            capacity.check(0, "full", DType::F32, usize::MAX, 0).is_err(),
            "no overflow"
        );
    }
}
