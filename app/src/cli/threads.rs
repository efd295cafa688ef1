//! The CPU thread count. Rayon's global pool can be sized only once, before its first use, so a
//! subcommand calls `init` before touching any tensor.

use anyhow::Context;

pub fn init(threads: usize) -> anyhow::Result<()> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .with_context(|| format!("cannot start {threads} worker threads"))
}
