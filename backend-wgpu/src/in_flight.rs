//! Back-pressure: the submissions the GPU may not have finished yet, at most a fixed number. A
//! trainer that syncs only every N steps would otherwise let the CPU record and queue work
//! unboundedly far ahead of the GPU (and hold every buffer that work uses).

use std::collections::VecDeque;

/// Submissions waiting on the GPU, oldest first, of which at most `max` are kept in flight.
pub struct InFlight<T> {
    queue: VecDeque<T>,
    max: usize,
}

impl<T> InFlight<T> {
    pub fn new(max: usize) -> InFlight<T> {
        assert!(max > 0, "at least one submission must be allowed in flight");
        InFlight {
            queue: VecDeque::with_capacity(max + 1),
            max,
        }
    }

    /// Notes a new submission; returns the oldest ones to wait for (in order) so that at most
    /// `max` remain in flight.
    pub fn submitted(&mut self, submission: T) -> impl Iterator<Item = T> + '_ {
        self.queue.push_back(submission);
        let over = self.queue.len().saturating_sub(self.max);
        self.queue.drain(..over)
    }

    /// Forgets every submission: a wait for all work has returned.
    pub fn all_done(&mut self) {
        self.queue.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    #[test]
    fn the_oldest_submission_is_waited_for_once_the_limit_is_passed() {
        let mut in_flight = InFlight::new(2);
        assert_eq!(in_flight.submitted(1).collect::<Vec<_>>(), [] as [i32; 0]);
        assert_eq!(in_flight.submitted(2).collect::<Vec<_>>(), [] as [i32; 0]);
        assert_eq!(in_flight.submitted(3).collect::<Vec<_>>(), [1]);
        assert_eq!(in_flight.submitted(4).collect::<Vec<_>>(), [2]);
        assert_eq!(in_flight.len(), 2);
        in_flight.all_done();
        assert_eq!(in_flight.len(), 0);
        assert_eq!(in_flight.submitted(5).collect::<Vec<_>>(), [] as [i32; 0]);
    }

    #[test]
    fn never_more_than_the_limit_stay_in_flight() {
        let mut in_flight = InFlight::new(3);
        let mut waited = vec![];
        for s in 0..100 {
            waited.extend(in_flight.submitted(s));
            assert!(in_flight.len() <= 3);
        }
        assert_eq!(waited, (0..97).collect::<Vec<_>>(), "each waited for once, in order");
    }
}
