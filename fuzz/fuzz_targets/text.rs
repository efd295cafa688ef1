//! The `text` target: see `lockstep_fuzz::text` (fuzz/src/lib.rs) for what it reads and how.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lockstep_fuzz::text(data));
