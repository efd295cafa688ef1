//! The reducer's communication thread: it reduces buckets one after another (to every rank, or
//! to the one that owns them), in the order they are queued, while the training thread goes on with backward. Queue order is the same on
//! every rank (buckets are launched strictly in index order), so collectives match up.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{BufferRef, Communicator, ReduceOp};
use crate::error::{Error, Result};

/// Where a bucket's reduction goes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Collective {
    /// To every rank (data parallel).
    AllReduce,
    /// To `root` alone (ZeRO stage 2's owner of the bucket).
    Reduce { root: usize },
}

struct Job {
    /// Dropped when the job is done: the last reference to a bucket this rank does not keep.
    flat: BufferRef,
    collective: Collective,
    op: ReduceOp,
}

#[derive(Default)]
struct Progress {
    completed: usize,
    /// Time spent inside all-reduces since the last `wait_all`.
    busy: Duration,
    /// The first failure; later jobs are skipped so every rank fails instead of hanging.
    error: Option<Error>,
    failed: bool,
}

pub(super) struct CommWorker {
    comm: Arc<dyn Communicator>,
    queue: Sender<Job>,
    progress: Arc<(Mutex<Progress>, Condvar)>,
    queued: usize,
}

/// What `wait_all` saw: how long the queued all-reduces ran and how long the caller waited.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Drained {
    pub busy: Duration,
    pub waited: Duration,
}

impl CommWorker {
    pub fn spawn(comm: Arc<dyn Communicator>) -> Result<CommWorker> {
        let (queue, jobs) = channel::<Job>();
        let progress = Arc::new((Mutex::new(Progress::default()), Condvar::new()));
        let shared = progress.clone();
        let worker_comm = comm.clone();
        // Not joined on drop: a thread stuck in a collective with a dead rank must not hold up
        // this replica's exit; dropping the queue ends it once its last job returns.
        std::thread::Builder::new()
            .name(format!("lockstep-comm-{}", worker_comm.rank()))
            .spawn(move || {
                for Job { flat, collective, op } in jobs {
                    let (lock, wake) = &*shared;
                    let failed = lock.lock().unwrap_or_else(|e| e.into_inner()).failed;
                    let started = Instant::now();
                    let outcome = if failed {
                        Ok(())
                    } else {
                        match collective {
                            Collective::AllReduce => worker_comm.all_reduce(&flat, op),
                            Collective::Reduce { root } => worker_comm.reduce(&flat, root, op),
                        }
                    };
                    // Let go of the bucket before the job counts as done, so a rank that does
                    // not keep it holds no copy once `wait_all` returns.
                    drop(flat);
                    let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
                    p.busy += started.elapsed();
                    if let Err(e) = outcome {
                        p.failed = true;
                        p.error.get_or_insert(e);
                    }
                    p.completed += 1;
                    wake.notify_all();
                }
            })
            .map_err(|e| Error::invalid("Reducer", format!("cannot start the communication thread: {e}")))?;
        Ok(CommWorker {
            comm,
            queue,
            progress,
            queued: 0,
        })
    }

    /// Queues an in-place reduction of `flat`; it starts once the jobs before it are done.
    pub fn launch(&mut self, flat: BufferRef, collective: Collective, op: ReduceOp) -> Result<()> {
        if self.queue.send(Job { flat, collective, op }).is_err() {
            return Err(Error::invalid("Reducer", "the communication thread has stopped"));
        }
        self.queued += 1;
        Ok(())
    }

    /// Blocks until every queued all-reduce has finished; returns the first error of the round.
    pub fn wait_all(&mut self) -> Result<Drained> {
        let started = Instant::now();
        let (lock, wake) = &*self.progress;
        let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
        while p.completed < self.queued {
            p = wake.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        let host_busy = std::mem::take(&mut p.busy);
        let drained = Drained {
            // A communicator that only queues its collectives (NCCL) times them on the device:
            // those finished by now, so a step's late ones count in the next step's report.
            busy: match self.comm.take_device_time() {
                Ok(Some(device)) => device,
                _ => host_busy,
            },
            waited: started.elapsed(),
        };
        if let Some(e) = p.error.take() {
            return Err(e);
        }
        if p.failed {
            return Err(Error::invalid(
                "Reducer",
                "an earlier gradient all-reduce failed; this replica cannot continue",
            ));
        }
        Ok(drained)
    }
}
