//! Draws recorded and replayed: a checkpoint records where in their streams the draws of its
//! block's first forward fell, and its recompute takes the same places again instead of
//! advancing the streams, so dropout masks repeat bit for bit and the layers after the block
//! see the streams as if no recompute had run.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::Generator;

/// One draw: which stream, how many values, and the first counter it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Draw {
    /// The stream's address: a consistency check, never dereferenced.
    stream: usize,
    len: usize,
    first: u64,
}

/// Draws in the order a forward made them.
pub(crate) type Draws = Vec<Draw>;

enum Frame {
    Record(Draws),
    Replay { draws: VecDeque<Draw>, diverged: bool },
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f`, returning its result and the draws made on this thread meanwhile.
pub(crate) fn record<R>(f: impl FnOnce() -> R) -> (R, Draws) {
    let frame = Pushed::new(Frame::Record(Vec::new()));
    let out = f();
    match frame.pop() {
        Some(Frame::Record(draws)) => (out, draws),
        _ => (out, Vec::new()),
    }
}

/// Runs `f` with its draws taken from `draws` in order; the flag is false when `f` drew
/// differently (another stream, another size, more or fewer draws): its values are then not
/// the recorded forward's.
pub(crate) fn replay<R>(draws: &Draws, f: impl FnOnce() -> R) -> (R, bool) {
    let frame = Pushed::new(Frame::Replay {
        draws: draws.iter().copied().collect(),
        diverged: false,
    });
    let out = f();
    let same = matches!(frame.pop(), Some(Frame::Replay { draws, diverged: false }) if draws.is_empty());
    (out, same)
}

/// The first counter of a draw of `len` values from `stream`: the innermost replay's next
/// draw, or `fresh()` (the stream advancing) outside any; every recording inside that
/// replay notes it.
pub(super) fn draw(stream: &Generator, len: usize, fresh: impl FnOnce() -> u64) -> u64 {
    let key = stream as *const Generator as usize;
    FRAMES.with(|frames| {
        let mut frames = frames.borrow_mut();
        let replaying = frames.iter().rposition(|f| matches!(f, Frame::Replay { .. }));
        let replayed = replaying.and_then(|i| match &mut frames[i] {
            Frame::Replay { draws, diverged } => match draws.pop_front() {
                Some(d) if d.stream == key && d.len == len => Some(d.first),
                _ => {
                    *diverged = true;
                    None
                }
            },
            Frame::Record(_) => None,
        });
        let first = replayed.unwrap_or_else(fresh);
        for frame in &mut frames[replaying.map_or(0, |i| i + 1)..] {
            if let Frame::Record(draws) = frame {
                draws.push(Draw {
                    stream: key,
                    len,
                    first,
                });
            }
        }
        first
    })
}

/// A frame on this thread's stack, taken off by `pop` or, if `f` panicked, on drop.
struct Pushed(bool);

impl Pushed {
    fn new(frame: Frame) -> Pushed {
        FRAMES.with(|f| f.borrow_mut().push(frame));
        Pushed(true)
    }
    fn pop(mut self) -> Option<Frame> {
        self.0 = false;
        FRAMES.with(|f| f.borrow_mut().pop())
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        if self.0 {
            FRAMES.with(|f| f.borrow_mut().pop());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_repeats_the_recorded_draws_and_leaves_the_stream_where_it_was() {
        let g = Generator::new(3);
        g.advance(8);
        let ((), draws) = record(|| {
            g.advance(10);
            g.advance(4);
        });
        let after = g.state();
        let (firsts, same) = replay(&draws, || [g.advance(10), g.advance(4)]);
        assert!(same);
        assert_eq!(firsts, [2, 5]);
        assert_eq!(g.state(), after, "the replay took nothing from the stream");
    }

    #[test]
    fn a_replay_that_draws_differently_says_so() {
        let g = Generator::new(3);
        let ((), draws) = record(|| {
            g.advance(10);
        });
        assert!(!replay(&draws, || g.advance(12)).1, "another size");
        assert!(!replay(&draws, || ()).1, "fewer draws");
        assert!(!replay(&draws, || [g.advance(10), g.advance(1)]).1, "more draws");
    }

    #[test]
    fn a_recording_inside_a_replay_notes_the_replayed_draws() {
        let g = Generator::new(3);
        let ((), outer) = record(|| {
            g.advance(4);
        });
        g.advance(40);
        let ((_, inner), same) = replay(&outer, || record(|| g.advance(4)));
        assert!(same);
        assert_eq!(replay(&inner, || g.advance(4)), (0, true));
    }
}
