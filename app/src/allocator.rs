//! The process's allocator: mimalloc, told to keep the memory it frees for the next allocation
//! instead of handing it back to the OS a second later.
//!
//! A CPU training step longer than that second frees and takes again the same large buffers
//! every step (gemm's packing buffers above all, which the gemm crate allocates on each call),
//! and memory handed back is faulted in again, zeroed by the kernel: on gpt-char that was 18k
//! page faults and about 12% of the CPU time. What is kept never exceeds what the run held at
//! once, so the peak is unchanged.

use libmimalloc_sys::{mi_option_set, mi_option_t};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the 16th of its `mi_option_t` enum in v2 and v3; the sys
/// crate names no constant for it): milliseconds before freed memory goes back to the OS, -1
/// for never. The test below checks the number against the option's default.
const PURGE_DELAY: mi_option_t = 15;

/// Turns mimalloc's purging off. Call first thing in `main`, before any other thread exists.
pub fn keep_freed_memory() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table; the option is a valid
    // `mi_option_t` (checked by the test below) and no other thread exists yet to race with it
    // (mimalloc documents the option functions as not thread safe).
    unsafe { mi_option_set(PURGE_DELAY, -1) }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_long;

    use libmimalloc_sys::mi_option_get;

    use super::*;

    /// The purge delay in force, in milliseconds (-1: never).
    fn purge_delay() -> c_long {
        // SAFETY: reads one entry of the option table. Other tests' threads may allocate
        // meanwhile; the option is one aligned integer, which they only read.
        unsafe { mi_option_get(PURGE_DELAY) }
    }

    #[test]
    fn the_purge_delay_option_is_the_one_turned_off() {
        // mimalloc v3's default purge delay is 1000 ms (v2's 10): a wrong enum number would read
        // another option's value (none of its neighbours defaults to either).
        let default = purge_delay();
        assert!(
            default == 1000 || default == 10,
            "option {PURGE_DELAY} reads {default}, not the purge delay"
        );
        keep_freed_memory();
        assert_eq!(purge_delay(), -1);
    }
}
