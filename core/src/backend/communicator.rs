//! Collectives over device buffers, and the in-process implementation across local devices.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Backend, BufferRef};
use crate::dtype::{Element, HostVec};
use crate::error::{Error, Result};
use crate::map_host_vec;
use crate::shape::Layout;

/// How a collective combines the ranks' values, elementwise (as `torch.distributed.ReduceOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The sum divided by the world size (NCCL's `ncclAvg`), as DDP averages gradients.
    Mean,
    /// The largest value over ranks.
    Max,
}

/// One rank's view of a group of ranks. Every rank must call the same collectives in the same
/// order (as with NCCL and MPI); buffers are whole, contiguous and of equal dtype across ranks.
pub trait Communicator: Send + Sync {
    /// This member's index in the group, from 0.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    /// Reduces `buf` across ranks, in place; every rank ends with the same bits.
    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()>;
    /// Reduces `buf` across ranks into root's `buf`; the other ranks' `buf` is left unspecified
    /// (as `MPI_Reduce`, `ncclReduce`). In-process and MPI groups give root the bits `all_reduce`
    /// would. ZeRO stage 2 sends each gradient only to the rank that steps it so. The default
    /// all-reduces: right everywhere, at all-reduce's cost.
    fn reduce(&self, buf: &BufferRef, root: usize, op: ReduceOp) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::invalid(
                "reduce",
                format!("root {root} is not a rank of a group of {}", self.world_size()),
            ));
        }
        self.all_reduce(buf, op)
    }
    /// Overwrites `buf` on every rank with root's.
    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()>;
    /// `output` (world_size × input length) receives every rank's `input`, in rank order.
    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()>;
    /// Reduces `input` (world_size × output length) across ranks; rank r keeps chunk r.
    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()>;
    /// Blocks until every rank of the group has called it (as `torch.distributed.barrier`).
    fn barrier(&self) -> Result<()>;
    /// Sends the whole of `buf` to rank `to`, which takes it with `recv` into a buffer of the
    /// same dtype and length (pipeline stages pass activations so). Messages from one rank to
    /// another arrive in the order sent.
    fn send(&self, _buf: &BufferRef, _to: usize) -> Result<()> {
        Err(no_point_to_point("send", self.rank()))
    }
    /// Overwrites `buf` with the next message from rank `from`.
    fn recv(&self, _buf: &BufferRef, _from: usize) -> Result<()> {
        Err(no_point_to_point("recv", self.rank()))
    }
    /// How long the collectives that finished since the last call ran on the device, for
    /// communicators whose calls only queue the work (NCCL), where timing the call on the host
    /// measures the enqueue alone; `None` (the default) where a call returns when its
    /// collective is done, so the host's timing is right.
    fn take_device_time(&self) -> Result<Option<std::time::Duration>> {
        Ok(None)
    }
}

/// An error unless `peer` is another rank of `rank`'s group of `world` (a `send` or `recv`'s
/// other end).
pub fn check_peer(op: &'static str, rank: usize, world: usize, peer: usize) -> Result<()> {
    if peer >= world || peer == rank {
        return Err(Error::Collective {
            op,
            rank,
            msg: format!("rank {peer} is not another rank of this group of {world}"),
        });
    }
    Ok(())
}

fn no_point_to_point(op: &'static str, rank: usize) -> Error {
    Error::Collective {
        op,
        rank,
        msg: "this communicator has no point-to-point messages (the in-process and MPI ones do)".into(),
    }
}

/// In-process collectives for devices driven by one thread each, staged through host memory,
/// so any mix of backends works. Built as a group: `LocalCommunicator::group(backends)`.
pub struct LocalCommunicator {
    rank: usize,
    backend: Arc<dyn Backend>,
    shared: Arc<Rendezvous>,
}

struct Rendezvous {
    world: usize,
    timeout: Duration,
    state: Mutex<RoundState>,
    wake: Condvar,
    mail: Mutex<Mailboxes>,
    mail_wake: Condvar,
}

/// Point-to-point messages not yet received, by (from, to), oldest first, and the ranks that
/// have left (a receiver waiting on one of them fails at once).
#[derive(Default)]
struct Mailboxes {
    queues: HashMap<(usize, usize), VecDeque<HostVec>>,
    left: HashSet<usize>,
}

#[derive(Default)]
struct RoundState {
    round: u64,
    op: Option<&'static str>,
    slots: Vec<Option<HostVec>>,
    /// The contributions of the last completed round, read by every rank of that round.
    finished: Option<Arc<Vec<HostVec>>>,
    /// A rank whose communicator was dropped: the others must not wait for it.
    departed: Option<usize>,
}

impl LocalCommunicator {
    /// One communicator per backend, rank i on `backends[i]`, with the default 10-minute timeout.
    pub fn group(backends: Vec<Arc<dyn Backend>>) -> Vec<LocalCommunicator> {
        Self::group_with_timeout(backends, Duration::from_secs(600))
    }

    /// As `group`, with the time a rank waits in a collective or `recv` for the others before failing
    /// with an error naming the ranks that never arrived.
    pub fn group_with_timeout(backends: Vec<Arc<dyn Backend>>, timeout: Duration) -> Vec<LocalCommunicator> {
        let world = backends.len();
        let shared = Arc::new(Rendezvous {
            world,
            timeout,
            state: Mutex::new(RoundState {
                slots: vec![None; world],
                ..Default::default()
            }),
            wake: Condvar::new(),
            mail: Mutex::new(Mailboxes::default()),
            mail_wake: Condvar::new(),
        });
        backends
            .into_iter()
            .enumerate()
            .map(|(rank, backend)| LocalCommunicator {
                rank,
                backend,
                shared: shared.clone(),
            })
            .collect()
    }

    fn err(&self, op: &'static str, msg: impl Into<String>) -> Error {
        Error::Collective {
            op,
            rank: self.rank,
            msg: msg.into(),
        }
    }

    fn read(&self, buf: &BufferRef) -> Result<HostVec> {
        read_whole(self.backend.as_ref(), buf)
    }

    fn write(&self, buf: &BufferRef, data: &HostVec) -> Result<()> {
        write_whole(self.backend.as_ref(), buf, data)
    }

    /// Every rank contributes one host vector and receives all of them, in rank order.
    fn exchange(&self, op: &'static str, data: HostVec) -> Result<Arc<Vec<HostVec>>> {
        let shared = &self.shared;
        let mut st = shared
            .state
            .lock()
            .map_err(|_| self.err(op, "a rank panicked inside a collective"))?;
        if let Some(gone) = st.departed {
            return Err(self.err(
                op,
                format!("rank {gone} has left the group (its thread ended or failed)"),
            ));
        }
        match st.op {
            Some(other) if other != op => {
                return Err(self.err(
                    op,
                    format!(
                        "other ranks are in `{other}`: every rank must call the same collectives in the same order"
                    ),
                ));
            }
            _ => st.op = Some(op),
        }
        if let Some(first) = st
            .slots
            .iter()
            .flatten()
            .next()
            .filter(|first| first.dtype() != data.dtype())
        {
            return Err(self.err(
                op,
                format!("dtype {} differs from another rank's {}", data.dtype(), first.dtype()),
            ));
        }
        st.slots[self.rank] = Some(data);
        let round = st.round;
        if st.slots.iter().all(Option::is_some) {
            let all: Vec<HostVec> = st.slots.iter_mut().map(|s| s.take().expect("checked above")).collect();
            st.finished = Some(Arc::new(all));
            st.round += 1;
            st.op = None;
            shared.wake.notify_all();
            return Ok(st.finished.clone().expect("just set"));
        }
        let deadline = Instant::now() + shared.timeout;
        while st.round == round {
            if let Some(gone) = st.departed {
                // Fix: a rank that gave up (e.g. timed out) leaves first; name the ranks that
                // never arrived too, or every other rank would blame only the one that left.
                let missing: Vec<usize> = (0..shared.world)
                    .filter(|&r| r != gone && st.slots[r].is_none())
                    .collect();
                let note = if missing.is_empty() {
                    String::new()
                } else {
                    format!("; rank(s) {missing:?} never joined this {op}")
                };
                return Err(self.err(
                    op,
                    format!("rank {gone} has left the group (its thread ended or failed){note}"),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..shared.world).filter(|&r| st.slots[r].is_none()).collect();
                return Err(self.err(
                    op,
                    format!("timed out after {:?} waiting for rank(s) {missing:?}", shared.timeout),
                ));
            }
            st = shared
                .wake
                .wait_timeout(st, deadline - now)
                .map_err(|_| self.err(op, "a rank panicked inside a collective"))?
                .0;
        }
        Ok(st.finished.clone().expect("a finished round leaves its result"))
    }

    fn check_len(&self, op: &'static str, all: &[HostVec], len: usize) -> Result<()> {
        match all.iter().position(|v| v.len() != len) {
            Some(r) => Err(self.err(
                op,
                format!("rank {r} passed {} elements, this rank {len}", all[r].len()),
            )),
            None => Ok(()),
        }
    }
}

/// A whole device buffer on the host: how host-staged communicators (in-process, MPI) send it.
pub fn read_whole(backend: &dyn Backend, buf: &BufferRef) -> Result<HostVec> {
    backend.to_host(buf, &Layout::contiguous([buf.len()]))
}

/// Overwrites a whole device buffer with `data` (as long as it).
pub fn write_whole(backend: &dyn Backend, buf: &BufferRef, data: &HostVec) -> Result<()> {
    let staged = backend.from_host(data)?;
    let layout = Layout::contiguous([buf.len()]);
    backend.copy_strided(&staged, &layout, buf, &layout)
}

/// Reduces `range` of equal-length vectors elementwise in f64, in rank order, so every rank
/// gets the same bits. Reads the typed values in place: no f64 copy of whole vectors.
fn reduce_host(all: &[HostVec], op: ReduceOp, range: std::ops::Range<usize>) -> HostVec {
    let dtype = all[0].dtype();
    let mut acc = vec![0.0f64; range.len()];
    for (rank, contribution) in all.iter().enumerate() {
        map_host_vec!(contribution, v => {
            for (a, x) in acc.iter_mut().zip(&v[range.clone()]) {
                let x = x.to_f64();
                *a = match op {
                    _ if rank == 0 => x,
                    ReduceOp::Sum | ReduceOp::Mean => *a + x,
                    ReduceOp::Max => a.max(x),
                };
            }
        });
    }
    if op == ReduceOp::Mean {
        let n = all.len() as f64;
        acc.iter_mut().for_each(|a| *a /= n);
    }
    HostVec::from_f64(dtype, &acc)
}

/// The part of `len` elements that `rank` of `world` reduces in an all-reduce.
fn chunk_of(rank: usize, world: usize, len: usize) -> std::ops::Range<usize> {
    let per = len.div_ceil(world);
    (rank * per).min(len)..((rank + 1) * per).min(len)
}

impl Communicator for LocalCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.world
    }

    /// A reduce-scatter (each rank reduces its chunk of everyone's data) and an all-gather of
    /// the reduced chunks: each rank does 1/world of the arithmetic.
    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()> {
        let all = self.exchange("all_reduce", self.read(buf)?)?;
        self.check_len("all_reduce", &all, buf.len())?;
        let world = self.world_size();
        let mine = reduce_host(&all, op, chunk_of(self.rank, world, buf.len()));
        drop(all);
        let reduced = self.exchange("all_reduce", mine)?;
        for (rank, part) in reduced.iter().enumerate() {
            let range = chunk_of(rank, world, buf.len());
            if part.len() != range.len() {
                return Err(self.err("all_reduce", format!("rank {rank} returned a chunk of another size")));
            }
            if !part.is_empty() {
                let staged = self.backend.from_host(part)?;
                let target = Layout {
                    offset: range.start,
                    ..Layout::contiguous([range.len()])
                };
                self.backend
                    .copy_strided(&staged, &Layout::contiguous([range.len()]), buf, &target)?;
            }
        }
        Ok(())
    }

    /// Every rank's data reaches root, which reduces the whole buffer as `all_reduce`'s chunks
    /// would (the same elementwise order over ranks), so root holds all-reduce's bits.
    fn reduce(&self, buf: &BufferRef, root: usize, op: ReduceOp) -> Result<()> {
        if root >= self.world_size() {
            return Err(self.err(
                "reduce",
                format!("root {root} is not a rank of a group of {}", self.world_size()),
            ));
        }
        let all = self.exchange("reduce", self.read(buf)?)?;
        self.check_len("reduce", &all, buf.len())?;
        if self.rank == root {
            self.write(buf, &reduce_host(&all, op, 0..buf.len()))?;
        }
        Ok(())
    }

    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(self.err(
                "broadcast",
                format!("root {root} is not a rank of a group of {}", self.world_size()),
            ));
        }
        let mine = if self.rank == root {
            self.read(buf)?
        } else {
            HostVec::from_f64(buf.dtype(), &[])
        };
        let all = self.exchange("broadcast", mine)?;
        if all[root].len() != buf.len() {
            return Err(self.err(
                "broadcast",
                format!(
                    "root sent {} elements, this buffer holds {}",
                    all[root].len(),
                    buf.len()
                ),
            ));
        }
        if self.rank != root {
            self.write(buf, &all[root])
        } else {
            Ok(())
        }
    }

    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()> {
        if output.len() != input.len() * self.world_size() {
            return Err(self.err(
                "all_gather",
                format!(
                    "output holds {} elements, expected {} x {}",
                    output.len(),
                    self.world_size(),
                    input.len()
                ),
            ));
        }
        let all = self.exchange("all_gather", self.read(input)?)?;
        self.check_len("all_gather", &all, input.len())?;
        let joined: Vec<f64> = all.iter().flat_map(|v| v.to_f64_vec()).collect();
        self.write(output, &HostVec::from_f64(output.dtype(), &joined))
    }

    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()> {
        let chunk = output.len();
        if input.len() != chunk * self.world_size() {
            return Err(self.err(
                "reduce_scatter",
                format!(
                    "input holds {} elements, expected {} x {chunk}",
                    input.len(),
                    self.world_size()
                ),
            ));
        }
        let all = self.exchange("reduce_scatter", self.read(input)?)?;
        self.check_len("reduce_scatter", &all, input.len())?;
        let start = self.rank * chunk;
        self.write(output, &reduce_host(&all, op, start..start + chunk))
    }

    fn barrier(&self) -> Result<()> {
        self.exchange("barrier", HostVec::U32(vec![])).map(|_| ())
    }

    /// Buffered: returns once the message is queued.
    fn send(&self, buf: &BufferRef, to: usize) -> Result<()> {
        check_peer("send", self.rank, self.shared.world, to)?;
        let data = self.read(buf)?;
        let mut mail = self
            .shared
            .mail
            .lock()
            .map_err(|_| self.err("send", "a rank panicked while sending"))?;
        mail.queues.entry((self.rank, to)).or_default().push_back(data);
        self.shared.mail_wake.notify_all();
        Ok(())
    }

    fn recv(&self, buf: &BufferRef, from: usize) -> Result<()> {
        check_peer("recv", self.rank, self.shared.world, from)?;
        let shared = &self.shared;
        let started = Instant::now();
        let mut mail = shared
            .mail
            .lock()
            .map_err(|_| self.err("recv", "a rank panicked while sending"))?;
        let data = loop {
            if let Some(data) = mail.queues.get_mut(&(from, self.rank)).and_then(VecDeque::pop_front) {
                break data;
            }
            if mail.left.contains(&from) {
                return Err(self.err("recv", format!("rank {from} has left the group without sending")));
            }
            let waited = started.elapsed();
            if waited >= shared.timeout {
                return Err(self.err(
                    "recv",
                    format!(
                        "nothing came from rank {from} in {:?} (the collective timeout)",
                        shared.timeout
                    ),
                ));
            }
            // Woken by a send or a departure.
            mail = shared
                .mail_wake
                .wait_timeout(mail, shared.timeout - waited)
                .map_err(|_| self.err("recv", "a rank panicked while sending"))?
                .0;
        };
        drop(mail);
        if data.dtype() != buf.dtype() || data.len() != buf.len() {
            return Err(self.err(
                "recv",
                format!(
                    "rank {from} sent {} {} elements, this buffer holds {} {}",
                    data.len(),
                    data.dtype(),
                    buf.len(),
                    buf.dtype()
                ),
            ));
        }
        self.write(buf, &data)
    }
}

impl Drop for LocalCommunicator {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.state.lock() {
            // Only a rank that leaves while others may still call collectives matters; record the first.
            st.departed.get_or_insert(self.rank);
            self.shared.wake.notify_all();
        }
        if let Ok(mut mail) = self.shared.mail.lock() {
            mail.left.insert(self.rank);
        }
        self.shared.mail_wake.notify_all();
    }
}
