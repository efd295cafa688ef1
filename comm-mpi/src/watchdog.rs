//! The collective timeout MPI lacks (NCCL's watchdog, PyTorch's `timeout` of
//! `init_process_group`): a rank that hangs or is stopped, rather than dying, would keep every
//! other rank inside its MPI call forever, and mpirun only notices processes that end. A
//! watchdog thread per communicator looks at the call in flight; one that has waited past the
//! timeout is reported on stderr and ends the whole job with `MPI_Abort`, after which mpirun
//! names the ranks it stopped.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use ::mpi::topology::{Communicator as _, SimpleCommunicator};

/// How often the watchdog looks (a fraction of any sensible timeout).
const LOOK_EVERY: Duration = Duration::from_millis(200);

/// The exit code of an aborted job (as NCCL's watchdog, a plain failure).
const ABORT_CODE: i32 = 1;

/// How long MPI_Abort has to end this rank. It asks mpirun to end the job, and a rank whose
/// machine has lost its link to mpirun would wait on it forever: then the rank ends itself.
const ABORT_GRACE: Duration = Duration::from_secs(10);

/// The collective a communicator is in, if any.
#[derive(Default)]
pub struct InFlight {
    call: Mutex<Option<(&'static str, Instant)>>,
}

impl InFlight {
    /// Marks `op` as started until the returned guard drops.
    pub fn start(&self, op: &'static str) -> Running<'_> {
        *self.lock() = Some((op, Instant::now()));
        Running(self)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(&'static str, Instant)>> {
        self.call.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The call that has run longer than `timeout`, with how long.
    fn overdue(&self, timeout: Duration) -> Option<(&'static str, Duration)> {
        let (op, since) = (*self.lock())?;
        let waited = since.elapsed();
        (waited > timeout).then_some((op, waited))
    }
}

/// A collective in flight; it ends when this drops.
pub struct Running<'a>(&'a InFlight);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        *self.0.lock() = None;
    }
}

/// Watches `calls` until they are dropped; `finalized` says MPI has ended (nothing to abort).
pub fn watch(calls: Weak<InFlight>, rank: usize, timeout: Duration, finalized: impl Fn() -> bool + Send + 'static) {
    let spawned = thread::Builder::new().name("mpi-watchdog".into()).spawn(move || {
        while let Some(calls) = calls.upgrade() {
            if let Some((op, waited)) = calls.overdue(timeout)
                && !finalized()
            {
                eprintln!(
                    "lockstep: rank {rank}: {op} on MPI has waited {:.0}s for the other ranks (--collective-timeout \
                     {}s): one of them is hung, stopped or far slower; ending the job (MPI_Abort), and mpirun names \
                     the ranks it stops. Raise --collective-timeout if a step really takes this long.",
                    waited.as_secs_f64(),
                    timeout.as_secs_f64()
                );
                end_if_abort_hangs(rank);
                SimpleCommunicator::world().abort(ABORT_CODE);
            }
            drop(calls);
            thread::sleep(LOOK_EVERY);
        }
    });
    if let Err(e) = spawned {
        eprintln!("lockstep: rank {rank}: no MPI collective timeout (cannot start its thread: {e})");
    }
}

/// Ends this process ABORT_GRACE from now, in case MPI_Abort cannot reach mpirun.
fn end_if_abort_hangs(rank: usize) {
    let _ = thread::Builder::new().name("mpi-abort-grace".into()).spawn(move || {
        thread::sleep(ABORT_GRACE);
        eprintln!(
            "lockstep: rank {rank}: MPI_Abort did not end the job within {}s (mpirun is out of reach: this \
             machine's link is down?); this rank ends itself",
            ABORT_GRACE.as_secs()
        );
        std::process::exit(ABORT_CODE);
    });
}

/// One watched communicator's share: the calls in flight, kept alive by the communicator.
pub fn watched(rank: usize, timeout: Duration, finalized: impl Fn() -> bool + Send + 'static) -> Arc<InFlight> {
    let calls = Arc::new(InFlight::default());
    watch(Arc::downgrade(&calls), rank, timeout, finalized);
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_past_its_timeout_is_overdue() {
        let calls = InFlight::default();
        assert!(calls.overdue(Duration::ZERO).is_none(), "nothing in flight");
        let running = calls.start("all_reduce");
        thread::sleep(Duration::from_millis(20));
        assert!(calls.overdue(Duration::from_secs(60)).is_none());
        let (op, waited) = calls.overdue(Duration::from_millis(10)).expect("overdue");
        assert_eq!(op, "all_reduce");
        assert!(waited >= Duration::from_millis(20));
        drop(running);
        assert!(calls.overdue(Duration::ZERO).is_none(), "ended");
    }
}
