//! Ctrl-C and SIGTERM (a scheduler preempting the job): the first asks the run to stop after
//! its step, so the checkpoint callbacks save as at any end (replicas of a data-parallel run
//! agree on the step at the next logged one); a second ends the process at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

/// The flag the first signal sets, after printing `first` (what happens now).
pub fn stop_on_signal(first: &'static str) -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln_whole!("\nlockstep: interrupted again: stopping now, without a checkpoint");
            std::process::exit(130);
        }
        eprintln_whole!("\nlockstep: {first}; interrupt again to stop at once");
    })
    .context("cannot install the Ctrl-C / SIGTERM handler")?;
    Ok(stop)
}
