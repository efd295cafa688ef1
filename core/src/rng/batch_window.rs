//! Random draws keyed to a sample's position in the step's global batch, not to the device that
//! computes it. A data-parallel replica enters its window (its samples' place in the global
//! batch) around its forward pass; a draw over a per-sample tensor then reserves the counters
//! of the whole global batch, as one device would, and takes its samples' part. Dropout masks
//! are so the same on any number of devices, and a run on N replicas follows the one-device run.

use std::cell::Cell;

use super::Generator;

/// Where this thread's batch lies in the step's global batch: samples `start .. start + len`
/// of `global`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchWindow {
    /// The global position of this batch's first sample.
    pub start: usize,
    /// Samples in this batch.
    pub len: usize,
    /// Samples in the global batch, every replica's together.
    pub global: usize,
}

thread_local! {
    static WINDOW: Cell<Option<BatchWindow>> = const { Cell::new(None) };
}

impl BatchWindow {
    /// Makes this thread's draws take this window's part of the global batch's stream until
    /// the guard drops.
    pub fn enter(self) -> BatchWindowGuard {
        BatchWindowGuard {
            previous: WINDOW.with(|w| w.replace(Some(self))),
        }
    }

    /// Puts this thread in `window` (None: in none) until the guard drops: a checkpoint's
    /// recompute draws in the window its first forward drew in.
    pub(crate) fn restore(window: Option<BatchWindow>) -> BatchWindowGuard {
        BatchWindowGuard {
            previous: WINDOW.with(|w| w.replace(window)),
        }
    }

    /// The window this thread is in; none outside a data-parallel forward pass.
    pub fn current() -> Option<BatchWindow> {
        WINDOW.with(Cell::get)
    }

    /// This thread's window with the elements per sample, where a tensor of `len` elements
    /// whose leading axis is `leading` long holds the window's samples (`[n·k, …]` for its `n`
    /// samples, sample-major).
    fn holding(len: usize, leading: usize) -> Option<(BatchWindow, usize)> {
        BatchWindow::current()
            .filter(|w| w.len > 0 && leading.is_multiple_of(w.len) && len.is_multiple_of(w.len))
            .map(|w| (w, len / w.len))
    }

    /// Whether a draw over such a tensor starts inside a Philox block of the global batch's
    /// stream (`StreamPlace::skip` > 0), where the backends' kernels cannot start.
    pub fn starts_inside_a_block(len: usize, leading: usize) -> bool {
        BatchWindow::holding(len, leading).is_some_and(|(w, per_sample)| !(w.start * per_sample).is_multiple_of(4))
    }

    /// This batch's part of the global batch, the weight of its mean loss in the global mean.
    pub fn fraction(&self) -> f64 {
        self.len as f64 / self.global.max(1) as f64
    }
}

/// Puts back the window that was in force before `BatchWindow::enter`.
pub struct BatchWindowGuard {
    previous: Option<BatchWindow>,
}

impl Drop for BatchWindowGuard {
    fn drop(&mut self) {
        WINDOW.with(|w| w.set(self.previous));
    }
}

/// Where a draw over a tensor lies in its generator's stream: the tensor's element `e` takes
/// element `skip + e` of the stream from `counter` (word `(skip + e) % 4` of block
/// `counter + (skip + e) / 4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamPlace {
    /// The stream's block holding the tensor's first element.
    pub counter: u64,
    /// Elements of that block before the tensor's first (0 to 3).
    pub skip: usize,
}

impl Generator {
    /// Reserves the stream for a draw over a tensor of `len` elements whose leading axis is
    /// `leading` long. Inside a `BatchWindow` whose samples the tensor holds, the global batch's
    /// counters are reserved and the tensor takes its samples' part; otherwise (one device, or a tensor not laid out per
    /// sample) it takes the next `len` elements, as it always did.
    pub fn reserve(&self, len: usize, leading: usize) -> StreamPlace {
        match BatchWindow::holding(len, leading) {
            Some((window, per_sample)) => {
                let first = self.advance(per_sample * window.global);
                let offset = per_sample * window.start;
                StreamPlace {
                    counter: first + (offset / 4) as u64,
                    skip: offset % 4,
                }
            }
            None => StreamPlace {
                counter: self.advance(len),
                skip: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_window_a_draw_takes_the_next_elements() {
        let g = Generator::new(1);
        assert_eq!(g.reserve(10, 2), StreamPlace { counter: 0, skip: 0 });
        assert_eq!(g.state().1, 3);
    }

    #[test]
    fn a_replica_takes_its_samples_part_of_the_global_batchs_stream() {
        // 3 samples of 6 elements each at positions 2..5 of a global batch of 8.
        let g = Generator::from_state(1, 100);
        let _window = BatchWindow {
            start: 2,
            len: 3,
            global: 8,
        }
        .enter();
        assert_eq!(g.reserve(18, 3), StreamPlace { counter: 103, skip: 0 });
        assert_eq!(g.state().1, 112, "the whole global batch's 48 elements are reserved");
        // Element 30 of the global stream (sample 5's first) is word 2 of block 7.
        let _later = BatchWindow {
            start: 5,
            len: 1,
            global: 8,
        }
        .enter();
        assert_eq!(g.reserve(6, 1), StreamPlace { counter: 119, skip: 2 });
    }

    #[test]
    fn a_tensor_not_laid_out_per_sample_draws_as_on_one_device() {
        let g = Generator::new(1);
        let window = BatchWindow {
            start: 4,
            len: 4,
            global: 8,
        }
        .enter();
        assert_eq!(g.reserve(6, 3), StreamPlace { counter: 0, skip: 0 });
        drop(window);
        assert_eq!(BatchWindow::current(), None, "the guard puts the previous window back");
    }
}
