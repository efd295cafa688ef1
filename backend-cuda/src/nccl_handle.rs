//! The NCCL communicator handle and its one-way life: live, then aborted. `ncclCommAbort` frees
//! the communicator, so once aborted the handle must never reach NCCL again: every use and the
//! drop go through this state, and a timeout or a dead peer ends in an error naming the first
//! failure instead of a use after free.

use std::sync::Mutex;

use cudarc::nccl::sys;

struct RawComm(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread, one call at a time (the mutex).
unsafe impl Send for RawComm {}

enum State {
    Live(RawComm),
    /// Freed by NCCL; why it was aborted.
    Aborted(String),
}

pub(crate) struct CommHandle {
    state: Mutex<State>,
}

impl CommHandle {
    pub(crate) fn new(comm: sys::ncclComm_t) -> CommHandle {
        CommHandle {
            state: Mutex::new(State::Live(RawComm(comm))),
        }
    }

    /// Runs `f` with the live handle (one call at a time), or returns why there is none.
    pub(crate) fn with<R>(&self, f: impl FnOnce(sys::ncclComm_t) -> R) -> std::result::Result<R, String> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Live(comm) => Ok(f(comm.0)),
            State::Aborted(why) => Err(why.clone()),
        }
    }

    /// Hands the live handle to `free` (ncclCommAbort) once and keeps `why`; later calls free
    /// nothing. Returns whether this call freed it.
    pub(crate) fn abort(&self, why: &str, free: impl FnOnce(sys::ncclComm_t)) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the first reason: it names the failure, later ones only its echoes.
        let State::Live(comm) = &*state else { return false };
        let comm = comm.0;
        *state = State::Aborted(why.to_string());
        free(comm);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn fake() -> CommHandle {
        // Never dereferenced: the tests only check which calls would reach NCCL.
        CommHandle::new(std::ptr::NonNull::<sys::ncclComm>::dangling().as_ptr())
    }

    #[test]
    fn an_aborted_handle_is_freed_once_and_never_used_again() {
        let handle = fake();
        let freed = Cell::new(0);
        assert_eq!(handle.with(|c| !c.is_null()), Ok(true));
        assert!(handle.abort("all_reduce timed out", |_| freed.set(freed.get() + 1)));
        // A second abort (the drop, or another thread's timeout) frees nothing.
        assert!(!handle.abort("dropped", |_| freed.set(freed.get() + 1)));
        assert_eq!(freed.get(), 1);
        let used = Cell::new(false);
        let after = handle.with(|_| used.set(true));
        assert_eq!(
            after,
            Err("all_reduce timed out".to_string()),
            "the first reason is kept"
        );
        assert!(!used.get(), "an aborted handle reached NCCL");
    }
}
