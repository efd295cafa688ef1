//! Waiting for queued GPU work by polling, never by blocking in the driver
//! (cuStreamSynchronize, cuEventSynchronize, a blocking NCCL init): work behind a collective
//! whose peer died never finishes, and only a thread that polls can notice the collective
//! timeout and say which rank it waited for. Pure, so the loop is tested without a GPU.

use std::time::{Duration, Instant};

/// Polls `done` (Ok(true) once the work finished) until the work finishes or `done` errs,
/// calling `watch` between polls: its error (a deadline passed, a peer failed) ends the wait.
pub(crate) fn poll_until<E>(
    mut done: impl FnMut() -> Result<bool, E>,
    mut watch: impl FnMut() -> Result<(), E>,
) -> Result<(), E> {
    let mut backoff = Backoff::default();
    loop {
        if done()? {
            return Ok(());
        }
        watch()?;
        backoff.pause();
    }
}

/// Short waits stay short (a few yields first); long ones cost little CPU (sleeps growing to
/// 160 µs, a small delay next to the collectives and steps being waited for).
#[derive(Default)]
struct Backoff {
    polls: u32,
}

impl Backoff {
    const YIELDS: u32 = 32;

    fn pause(&mut self) {
        self.polls = self.polls.saturating_add(1);
        if self.polls <= Self::YIELDS {
            std::thread::yield_now();
            return;
        }
        let doublings = (self.polls - Self::YIELDS).min(4);
        std::thread::sleep(Duration::from_micros(10 << doublings));
    }
}

/// When a wait must give up: `limit` after `since`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    since: Instant,
    limit: Duration,
}

impl Deadline {
    pub(crate) fn after(limit: Duration) -> Deadline {
        Deadline::from(Instant::now(), limit)
    }

    pub(crate) fn from(since: Instant, limit: Duration) -> Deadline {
        Deadline { since, limit }
    }

    /// Ok before the deadline; once it passed, the error `timed_out` makes of the limit.
    pub(crate) fn check<E>(&self, timed_out: impl FnOnce(Duration) -> E) -> Result<(), E> {
        if self.since.elapsed() >= self.limit {
            return Err(timed_out(self.limit));
        }
        Ok(())
    }
}

/// Polls `done` until it finishes, errs, or `deadline` passes (then `timed_out`'s error).
pub(crate) fn poll_with_deadline<E>(
    deadline: Deadline,
    done: impl FnMut() -> Result<bool, E>,
    timed_out: impl Fn(Duration) -> E,
) -> Result<(), E> {
    poll_until(done, || deadline.check(&timed_out))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::in_flight::timed_out_waiting;

    fn timed_out(limit: Duration) -> String {
        timed_out_waiting("init", limit, 0, 2)
    }

    #[test]
    fn work_that_never_finishes_times_out_after_the_deadline_naming_the_ranks() {
        let started = Instant::now();
        let never = || match started.elapsed() < Duration::from_secs(5) {
            true => Ok(false),
            false => Err("the deadline never ended the wait".to_string()),
        };
        let outcome = poll_with_deadline(Deadline::after(Duration::from_millis(50)), never, timed_out);
        let waited = started.elapsed();
        let why = outcome.expect_err("a wait on work that never finishes must time out");
        assert!(waited >= Duration::from_millis(50), "gave up early, after {waited:?}");
        assert!(waited < Duration::from_secs(1), "overslept the deadline: {waited:?}");
        assert!(why.contains("timed out after 50ms"), "{why}");
        assert!(why.contains("waiting for rank(s) [1]"), "{why}");
    }

    #[test]
    fn an_error_from_the_query_ends_the_wait_at_once() {
        let started = Instant::now();
        let watched = Cell::new(0);
        let outcome: Result<(), String> = poll_until(
            || Err("CUDA_ERROR_ILLEGAL_ADDRESS".to_string()),
            || {
                watched.set(watched.get() + 1);
                Deadline::after(Duration::from_secs(60)).check(timed_out)
            },
        );
        assert_eq!(outcome, Err("CUDA_ERROR_ILLEGAL_ADDRESS".to_string()));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited out the timeout first"
        );
        assert_eq!(watched.get(), 0, "the fault comes before any timeout check");
    }

    #[test]
    fn an_error_from_the_watch_ends_the_wait_at_once() {
        let outcome = poll_until(|| Ok(false), || Err("NCCL reported ncclRemoteError"));
        assert_eq!(outcome, Err("NCCL reported ncclRemoteError"));
    }

    #[test]
    fn work_that_finishes_is_waited_for_and_ok() {
        let polls = Cell::new(0);
        let outcome = poll_with_deadline(
            Deadline::after(Duration::from_secs(60)),
            || {
                polls.set(polls.get() + 1);
                Ok(polls.get() == 100)
            },
            timed_out,
        );
        assert_eq!(outcome, Ok(()));
        assert_eq!(polls.get(), 100, "polled until it finished, not past it");
    }

    /// Where a collective may be pending the host polls (`Gpu::wait_for`, `CommState::wait_all`,
    /// `nccl_init::settle`): cuStreamSynchronize, cuEventSynchronize and the blocking
    /// ncclCommInitRank would hold it forever once a peer died, past any timeout.
    #[test]
    fn the_waits_behind_collectives_poll_instead_of_blocking_in_the_driver() {
        let sources = [
            ("ops/transfer.rs", include_str!("ops/transfer.rs")),
            ("nccl.rs", include_str!("nccl.rs")),
            ("nccl_init.rs", include_str!("nccl_init.rs")),
        ];
        for (file, source) in sources {
            for blocking in [".synchronize()", "result::comm_init_rank("] {
                assert!(!source.contains(blocking), "{file} blocks in `{blocking}`");
            }
        }
        let gpu = include_str!("gpu.rs");
        let synchronize = &gpu[gpu.find("fn synchronize").expect("Gpu::synchronize")..];
        let body = &synchronize[..synchronize.find("\n    }").expect("its end")];
        assert!(
            body.contains("self.wait_for("),
            "Gpu::synchronize must wait through wait_for:\n{body}"
        );
        assert!(!body.contains(".synchronize()"), "{body}");
    }
}
