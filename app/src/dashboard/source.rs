//! Where a run's records come from: a run this process trains (a bounded channel, plus the
//! handles to pause and stop it), a metrics log another process is writing, or a finished log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use lockstep_core::train::Record;

use super::runs::{Follower, RunData};

/// The handles of a run this process trains.
pub struct RunControl {
    pub stop: Arc<AtomicBool>,
    pub pause: Arc<AtomicBool>,
    /// Whether `pause` holds the run: a single device's only (a paused replica would hold the
    /// others in their all-reduces until the collective timeout).
    pub pausable: bool,
    /// Set by the training thread when it returns; the message says how it ended.
    pub finished: Arc<std::sync::Mutex<Option<String>>>,
    /// The training thread of a run the window started itself: when the window goes, the run
    /// is stopped (it checkpoints) and waited for, so no run is cut off mid-write.
    pub thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl Drop for RunControl {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.stop.store(true, Ordering::Relaxed);
            self.pause.store(false, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

impl RunControl {
    pub fn paused(&self) -> bool {
        self.pause.load(Ordering::Relaxed)
    }
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    pub fn outcome(&self) -> Option<String> {
        self.finished.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

enum Feed {
    Live(Receiver<Record>),
    Follow { follower: Follower, next_poll: Instant },
    Finished,
}

pub struct Source {
    feed: Feed,
    pub run: RunData,
    pub control: Option<RunControl>,
}

/// Records folded per frame at most: a burst (a long log appearing at once) spreads over a few
/// frames instead of freezing one.
const RECORDS_PER_FRAME: usize = 200_000;
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

impl Source {
    pub fn live(name: &str, rx: Receiver<Record>, control: RunControl) -> Source {
        Source {
            feed: Feed::Live(rx),
            run: RunData::new(name),
            control: Some(control),
        }
    }

    pub fn follow(follower: Follower) -> Source {
        let name = super::runs::run_name(follower.path());
        Source {
            feed: Feed::Follow {
                follower,
                next_poll: Instant::now(),
            },
            run: RunData::new(name),
            control: None,
        }
    }

    pub fn finished(run: RunData) -> Source {
        Source {
            feed: Feed::Finished,
            run,
            control: None,
        }
    }

    /// Whether records may still arrive.
    pub fn is_live(&self) -> bool {
        match &self.feed {
            Feed::Live(_) => self.control.as_ref().is_none_or(|c| c.outcome().is_none()),
            Feed::Follow { .. } => self.run.end.is_none(),
            Feed::Finished => false,
        }
    }

    /// Folds whatever arrived since the last frame.
    pub fn poll(&mut self) {
        match &mut self.feed {
            Feed::Live(rx) => {
                for _ in 0..RECORDS_PER_FRAME {
                    match rx.try_recv() {
                        Ok(record) => self.run.apply(&record),
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
            }
            Feed::Follow { follower, next_poll } => {
                if Instant::now() < *next_poll {
                    return;
                }
                *next_poll = Instant::now() + FOLLOW_EVERY;
                match follower.poll() {
                    Ok(polled) => {
                        if polled.restarted {
                            self.run = RunData::new(self.run.name.clone());
                        }
                        for record in &polled.records {
                            self.run.apply(record);
                        }
                        self.run.warnings.extend(polled.warnings);
                    }
                    Err(e) => {
                        let warning = format!("cannot read {}: {e}", follower.path().display());
                        if self.run.warnings.last() != Some(&warning) {
                            self.run.warnings.push(warning);
                        }
                    }
                }
            }
            Feed::Finished => {}
        }
    }
}
