//! The collectives a communicator queued and has not yet seen finish, oldest first: each one's
//! deadline (the collective timeout, counted from when it was queued) and, once it finished,
//! how long it ran on the device. Generic over how completion is queried, so the timeout and
//! the timing are tested without a GPU.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wait::Deadline;

/// Queued device work that can say whether it finished.
pub(crate) trait Completion {
    /// Ok(true) once the work finished; Err(what the device reported) if it failed.
    fn finished(&self) -> Result<bool, String>;
    /// How long the work ran on the device; asked only once `finished` said so.
    fn device_time(&self) -> Duration;
}

/// Why a communicator cannot go on: the collective concerned and what happened to it.
#[derive(Debug, PartialEq)]
pub(crate) struct Stalled {
    pub op: &'static str,
    pub why: String,
}

pub(crate) struct InFlight<C> {
    queue: VecDeque<Queued<C>>,
    timeout: Duration,
    /// Device time of the collectives seen finished since the last `take_device_time`.
    device_time: Duration,
}

struct Queued<C> {
    work: C,
    queued: Instant,
    op: &'static str,
}

impl<C: Completion> InFlight<C> {
    pub(crate) fn new(timeout: Duration) -> InFlight<C> {
        InFlight {
            queue: VecDeque::new(),
            timeout,
            device_time: Duration::ZERO,
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub(crate) fn push(&mut self, work: C, op: &'static str) {
        self.queue.push_back(Queued {
            work,
            queued: Instant::now(),
            op,
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Retires the finished collectives (adding up their device time); errs when one failed on
    /// the device (at once: a kernel fault, not a peer) or the oldest unfinished one has run
    /// past the timeout (naming the ranks this `rank` of `world` waits for).
    pub(crate) fn progress(&mut self, rank: usize, world: usize) -> Result<(), Stalled> {
        while let Some(oldest) = self.queue.front() {
            match oldest.work.finished() {
                Ok(true) => {
                    self.device_time += oldest.work.device_time();
                    self.queue.pop_front();
                }
                Ok(false) => {
                    let op = oldest.op;
                    return Deadline::from(oldest.queued, self.timeout).check(|limit| Stalled {
                        op,
                        why: timed_out_waiting(op, limit, rank, world),
                    });
                }
                Err(fault) => {
                    return Err(Stalled {
                        op: oldest.op,
                        why: format!(
                            "the GPU reported {fault} while {} ran (a kernel failed on this device)",
                            oldest.op
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The device time of the collectives that finished since the last call.
    pub(crate) fn take_device_time(&mut self) -> Duration {
        std::mem::take(&mut self.device_time)
    }
}

/// The timeout error's text, worded as the host communicator's ("timed out after … waiting for
/// rank(s) […]"): NCCL cannot say which peer is missing, so it names every other rank.
pub(crate) fn timed_out_waiting(op: &str, limit: Duration, rank: usize, world: usize) -> String {
    let others: Vec<usize> = (0..world).filter(|&r| r != rank).collect();
    let ranks = if others.len() <= 8 {
        format!("rank(s) {others:?}")
    } else {
        format!("the other {} ranks", others.len())
    };
    format!(
        "{op} timed out after {limit:?} waiting for {ranks}: one of them died, hung or stopped calling \
         collectives (its own log says why); restart the run from its last checkpoint"
    )
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// Finished once `polls_left` polls have passed; `fault` fails it instead.
    struct Fake {
        polls_left: Cell<u32>,
        fault: Option<&'static str>,
        ran: Duration,
    }

    fn fake(polls: u32, ran_ms: u64) -> Fake {
        Fake {
            polls_left: Cell::new(polls),
            fault: None,
            ran: Duration::from_millis(ran_ms),
        }
    }

    impl Completion for Fake {
        fn finished(&self) -> Result<bool, String> {
            if let Some(fault) = self.fault {
                return Err(fault.into());
            }
            let left = self.polls_left.get();
            self.polls_left.set(left.saturating_sub(1));
            Ok(left == 0)
        }
        fn device_time(&self) -> Duration {
            self.ran
        }
    }

    #[test]
    fn a_collective_that_never_finishes_times_out_naming_the_other_ranks() {
        let mut in_flight = InFlight::new(Duration::from_millis(40));
        in_flight.push(fake(u32::MAX, 0), "all_reduce");
        assert_eq!(in_flight.progress(1, 3), Ok(()), "not yet past its deadline");
        std::thread::sleep(Duration::from_millis(50));
        let stalled = in_flight.progress(1, 3).expect_err("past its deadline");
        assert_eq!(stalled.op, "all_reduce");
        assert!(
            stalled
                .why
                .contains("all_reduce timed out after 40ms waiting for rank(s) [0, 2]"),
            "{}",
            stalled.why
        );
    }

    #[test]
    fn a_device_fault_is_reported_at_once_not_after_the_timeout() {
        let mut in_flight = InFlight::new(Duration::from_secs(600));
        in_flight.push(
            Fake {
                fault: Some("CUDA_ERROR_ILLEGAL_ADDRESS"),
                ..fake(u32::MAX, 0)
            },
            "broadcast",
        );
        let stalled = in_flight.progress(0, 2).expect_err("a fault");
        assert_eq!(stalled.op, "broadcast");
        assert!(stalled.why.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{}", stalled.why);
        assert!(
            stalled.why.contains("a kernel failed on this device"),
            "{}",
            stalled.why
        );
    }

    #[test]
    fn finished_collectives_are_retired_and_their_device_time_added_up() {
        let mut in_flight = InFlight::new(Duration::from_secs(600));
        in_flight.push(fake(0, 3), "all_reduce");
        in_flight.push(fake(1, 4), "all_reduce");
        assert_eq!(in_flight.progress(0, 2), Ok(()));
        assert!(!in_flight.is_empty(), "the second was still running");
        assert_eq!(in_flight.take_device_time(), Duration::from_millis(3));
        assert_eq!(in_flight.progress(0, 2), Ok(()));
        assert!(in_flight.is_empty());
        assert_eq!(in_flight.take_device_time(), Duration::from_millis(4));
        assert_eq!(in_flight.take_device_time(), Duration::ZERO, "taken once");
    }

    #[test]
    fn a_large_group_is_named_by_count() {
        let why = timed_out_waiting("barrier", Duration::from_secs(600), 3, 64);
        assert!(
            why.contains("timed out after 600s waiting for the other 63 ranks"),
            "{why}"
        );
    }
}
