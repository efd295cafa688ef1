//! The `command_line` target: see fuzz/src/command_line.rs for what it builds and checks.

#![no_main]

// The heap bound (`lockstep_fuzz::HEAP_LIMIT`) is lockstep_fuzz's global allocator.
use lockstep_fuzz as _;

// `encode` (the seed writer's) is unused here.
#[allow(dead_code)]
#[path = "../src/command_line.rs"]
mod command_line;

libfuzzer_sys::fuzz_target!(|data: &[u8]| command_line::run(data));
