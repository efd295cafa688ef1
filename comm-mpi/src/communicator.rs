//! Collectives across processes on MPI (the `mpi` feature): one process per device, started by
//! `mpirun`/`srun`. Buffers are staged through host memory as `LocalCommunicator` does, so any
//! backend works; the data moves and reduces inside the MPI library.
//!
//! Every collective first all-gathers a small header (`header.rs`): a rank that calls another
//! collective or passes another size makes every rank return an error, instead of MPI hanging
//! or truncating. A rank that dies is the launcher's business: mpirun ends the whole job (MPI's
//! own errors abort the job too: MPI_ERRORS_ARE_FATAL). A rank that hangs is the watchdog's
//! (`with_timeout`, `watchdog.rs`): MPI itself has no timeout.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use ::mpi::Threading;
use ::mpi::environment::Universe;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use lockstep_core::backend::{Backend, BufferRef, Communicator, ReduceOp, check_peer, read_whole, write_whole};
use lockstep_core::dtype::{DType, HostVec};
use lockstep_core::error::{Error, Result};
use lockstep_core::map_host_vec;

use crate::header::{Call, HEADER, op_code, rooted_op_code};
use crate::host::{bytes, bytes_mut, reduce_chunk, zeros};
use crate::watchdog::{self, InFlight};

/// MPI for this process: `MPI_Finalize` runs when it is dropped. Keep it in `main` until every
/// `MpiCommunicator` is gone (their collectives fail after it) and let `main` return: MPI wants
/// finalisation on the thread that initialised it (hence not `Send`), and
/// `std::process::exit` skips it.
pub struct MpiSession {
    universe: Option<Universe>,
    state: Arc<SessionState>,
    _init_thread_only: PhantomData<*const ()>,
}

struct SessionState {
    /// Read-locked by every collective and communicator drop, write-locked by finalisation, so
    /// no MPI call races `MPI_Finalize` or follows it.
    finalized: RwLock<bool>,
}

impl MpiSession {
    /// Ends every process of the job with `code` (`MPI_Abort` on the world): for a rank that
    /// fails while the others may wait in a collective for it, where `MPI_Finalize` would wait
    /// with them forever. The launcher reports which rank aborted.
    pub fn abort(self, code: i32) -> ! {
        match &self.universe {
            Some(universe) => universe.world().abort(code),
            None => std::process::abort(),
        }
    }
}

impl Drop for MpiSession {
    fn drop(&mut self) {
        let mut finalized = self.state.finalized.write().unwrap_or_else(PoisonError::into_inner);
        *finalized = true;
        drop(self.universe.take());
    }
}

struct RawComm(SimpleCommunicator);

// SAFETY: an MPI communicator handle is process-wide and, with MPI_THREAD_MULTIPLE (which `init`
// insists on), usable from any thread; the mutex around it keeps one call at a time on it.
unsafe impl Send for RawComm {}

/// One rank of an MPI communicator (the world from `init`, or a `duplicate` of one).
pub struct MpiCommunicator {
    /// `None` only while dropping.
    comm: Mutex<Option<RawComm>>,
    rank: usize,
    world: usize,
    backend: Arc<dyn Backend>,
    session: Arc<SessionState>,
    /// The collective timeout and the watchdog's view of the call in flight (`with_timeout`).
    watched: Option<(Duration, Arc<InFlight>)>,
}

impl MpiCommunicator {
    /// Initialises MPI with `MPI_THREAD_MULTIPLE` (the gradient reducer's thread and the training
    /// thread call collectives at the same time on different communicators) and returns the
    /// session and the world communicator, staging through `backend`.
    pub fn init(backend: Arc<dyn Backend>) -> Result<(MpiSession, MpiCommunicator)> {
        let (universe, level) = ::mpi::initialize_with_threading(Threading::Multiple).ok_or_else(|| {
            Error::invalid(
                "mpi init",
                "MPI is already initialised in this process: call MpiCommunicator::init once, keep its \
                 MpiSession, and make further communicators with `duplicate`",
            )
        })?;
        let world = universe.world();
        let session = MpiSession {
            universe: Some(universe),
            state: Arc::new(SessionState {
                finalized: RwLock::new(false),
            }),
            _init_thread_only: PhantomData,
        };
        let comm = MpiCommunicator::wrap(world, backend, session.state.clone());
        if level < Threading::Multiple {
            let rank = comm.rank;
            drop(comm);
            drop(session);
            return Err(Error::Collective {
                op: "mpi init",
                rank,
                msg: format!(
                    "the MPI library supports threads only up to {level:?}; Lockstep needs Multiple (the \
                     reducer communicates from its own thread): use an MPI built with thread support \
                     (OpenMPI 4 and MPICH have it by default)"
                ),
            });
        }
        Ok((session, comm))
    }

    fn wrap(comm: SimpleCommunicator, backend: Arc<dyn Backend>, session: Arc<SessionState>) -> MpiCommunicator {
        MpiCommunicator {
            rank: comm.rank() as usize,
            world: comm.size() as usize,
            comm: Mutex::new(Some(RawComm(comm))),
            backend,
            session,
            watched: None,
        }
    }

    /// Ends the whole job (`MPI_Abort`, after a message naming this rank and the call) when a
    /// collective has waited longer than `timeout` for the other ranks: a rank that hangs or
    /// is stopped would otherwise hold every rank forever. Duplicates inherit it.
    pub fn with_timeout(mut self, timeout: Duration) -> MpiCommunicator {
        let session = self.session.clone();
        // While MPI finalises (write-locked) or after, there is nothing left to abort.
        let finalized = move || session.finalized.try_read().map_or(true, |done| *done);
        self.watched = Some((timeout, watchdog::watched(self.rank, timeout, finalized)));
        self
    }

    /// A new communicator over the same ranks (`MPI_Comm_dup`) whose collectives never match
    /// this one's, so two threads can each drive one (SyncBatchNorm beside the gradient
    /// reducer). Collective: every rank must call it at the same point.
    pub fn duplicate(&self) -> Result<MpiCommunicator> {
        let dup = self.collective(Call::bare("duplicate"), Ok(()), |comm, ()| Ok(comm.duplicate()))?;
        let dup = MpiCommunicator::wrap(dup, self.backend.clone(), self.session.clone());
        Ok(match &self.watched {
            Some((timeout, _)) => dup.with_timeout(*timeout),
            None => dup,
        })
    }

    /// The backend whose buffers this communicator reads and writes.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn err(&self, op: &'static str, msg: impl Into<String>) -> Error {
        Error::Collective {
            op,
            rank: self.rank,
            msg: msg.into(),
        }
    }

    /// Runs one collective on this communicator: exchanges the headers, then runs `body` with
    /// what `prepared` holds only if every rank announced the same call with valid arguments.
    fn collective<P, T>(
        &self,
        call: Call,
        prepared: Result<P>,
        body: impl FnOnce(&SimpleCommunicator, P) -> Result<T>,
    ) -> Result<T> {
        let op = call.op;
        self.with_comm(op, |comm| {
            let mine = call.encode(prepared.is_ok());
            let mut all = vec![0u64; HEADER * self.world];
            comm.all_gather_into(&mine[..], &mut all[..]);
            let prepared = prepared?;
            match crate::header::first_difference(op, &mine, &all) {
                Some(msg) => Err(self.err(op, msg)),
                None => body(comm, prepared),
            }
        })
    }

    /// Runs `body` on the MPI communicator, unless MPI is finalised or this one is being
    /// dropped. One call at a time per communicator: a pipeline's point-to-point messages
    /// want a communicator of their own (`duplicate`).
    fn with_comm<T>(&self, op: &'static str, body: impl FnOnce(&SimpleCommunicator) -> Result<T>) -> Result<T> {
        let finalized = self.session.finalized.read().unwrap_or_else(PoisonError::into_inner);
        if *finalized {
            return Err(self.err(
                op,
                "MPI is finalised (its MpiSession was dropped): keep the session until every communicator is dropped",
            ));
        }
        let guard = self
            .comm
            .lock()
            .map_err(|_| self.err(op, "another thread panicked inside a call on this communicator"))?;
        let comm = &guard
            .as_ref()
            .ok_or_else(|| self.err(op, "the communicator is being dropped"))?
            .0;
        let _watched = self.watched.as_ref().map(|(_, calls)| calls.start(op));
        body(comm)
    }

    fn read(&self, buf: &BufferRef) -> Result<HostVec> {
        read_whole(self.backend.as_ref(), buf)
    }

    fn write(&self, buf: &BufferRef, data: &HostVec) -> Result<()> {
        write_whole(self.backend.as_ref(), buf, data)
    }

    /// An error unless `root` is a rank of this communicator.
    fn root_of(&self, op: &'static str, root: usize) -> Result<()> {
        if root < self.world {
            return Ok(());
        }
        Err(self.err(
            op,
            format!(
                "root {root} is not a rank of a group of {}: pass 0..{}",
                self.world, self.world
            ),
        ))
    }

    /// MPI counts are C ints: `count` (elements reduced, or bytes moved) must fit one.
    fn fits(&self, op: &'static str, dtype: DType, len: usize, count: usize) -> Result<()> {
        if count > i32::MAX as usize {
            return Err(self.err(
                op,
                format!(
                    "{len} {dtype} elements are too many for one MPI call (its counts are 32-bit): split the \
                     buffer, e.g. into smaller buckets"
                ),
            ));
        }
        Ok(())
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }

    /// A reduce-scatter then an all-gather: each element is reduced on one rank and copied to
    /// the others, so every rank has the same bits (MPI does not promise that of MPI_Allreduce).
    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()> {
        let name = "all_reduce";
        let world = self.world;
        let padded = buf.len().div_ceil(world) * world;
        let gathered_bytes = padded.saturating_mul(buf.dtype().size_in_bytes());
        let prepared = self
            .fits(name, buf.dtype(), buf.len(), gathered_bytes)
            .and_then(|()| self.read(buf));
        let call = Call {
            aux: op_code(op),
            ..Call::new(name, buf.dtype(), buf.len())
        };
        let reduced = self.collective(call, prepared, |comm, mut host| {
            map_host_vec!(&mut host, v => v.resize(padded, Default::default()));
            let chunk = reduce_chunk(comm, &host, op, world);
            let mut all = zeros(chunk.dtype(), padded);
            comm.all_gather_into(bytes(&chunk), bytes_mut(&mut all));
            map_host_vec!(&mut all, v => v.truncate(buf.len()));
            Ok(all)
        })?;
        self.write(buf, &reduced)
    }

    /// All-reduce's reduce-scatter, then a gather of the reduced chunks to root alone: root
    /// holds all-reduce's bits, and the other ranks receive nothing.
    fn reduce(&self, buf: &BufferRef, root: usize, op: ReduceOp) -> Result<()> {
        let name = "reduce";
        let world = self.world;
        let padded = buf.len().div_ceil(world) * world;
        let prepared = self.root_of(name, root).and_then(|()| {
            self.fits(
                name,
                buf.dtype(),
                buf.len(),
                padded.saturating_mul(buf.dtype().size_in_bytes()),
            )?;
            self.read(buf)
        });
        let call = Call {
            aux: rooted_op_code(root, op),
            ..Call::new(name, buf.dtype(), buf.len())
        };
        let reduced = self.collective(call, prepared, |comm, mut host| {
            map_host_vec!(&mut host, v => v.resize(padded, Default::default()));
            let chunk = reduce_chunk(comm, &host, op, world);
            let at_root = comm.process_at_rank(root as i32);
            if self.rank != root {
                at_root.gather_into(bytes(&chunk));
                return Ok(None);
            }
            let mut all = zeros(chunk.dtype(), padded);
            at_root.gather_into_root(bytes(&chunk), bytes_mut(&mut all));
            map_host_vec!(&mut all, v => v.truncate(buf.len()));
            Ok(Some(all))
        })?;
        match reduced {
            Some(all) => self.write(buf, &all),
            None => Ok(()),
        }
    }

    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        let name = "broadcast";
        let prepared = self.root_of(name, root).and_then(|()| {
            let size = buf.len().saturating_mul(buf.dtype().size_in_bytes());
            self.fits(name, buf.dtype(), buf.len(), size)?;
            if self.rank == root {
                self.read(buf)
            } else {
                Ok(zeros(buf.dtype(), buf.len()))
            }
        });
        let call = Call {
            aux: root,
            ..Call::new(name, buf.dtype(), buf.len())
        };
        let data = self.collective(call, prepared, |comm, mut host| {
            comm.process_at_rank(root as i32).broadcast_into(bytes_mut(&mut host));
            Ok(host)
        })?;
        if self.rank == root {
            Ok(())
        } else {
            self.write(buf, &data)
        }
    }

    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()> {
        let name = "all_gather";
        let prepared = if output.len() != input.len() * self.world || output.dtype() != input.dtype() {
            Err(self.err(
                name,
                format!(
                    "output holds {} {} elements, expected {} x {} {}: size it world_size x input",
                    output.len(),
                    output.dtype(),
                    self.world,
                    input.len(),
                    input.dtype()
                ),
            ))
        } else {
            let size = output.len().saturating_mul(output.dtype().size_in_bytes());
            self.fits(name, input.dtype(), output.len(), size)
                .and_then(|()| self.read(input))
        };
        let call = Call::new(name, input.dtype(), input.len());
        let gathered = self.collective(call, prepared, |comm, mine| {
            let mut all = zeros(mine.dtype(), output.len());
            comm.all_gather_into(bytes(&mine), bytes_mut(&mut all));
            Ok(all)
        })?;
        self.write(output, &gathered)
    }

    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()> {
        let name = "reduce_scatter";
        let prepared = if input.len() != output.len() * self.world || output.dtype() != input.dtype() {
            Err(self.err(
                name,
                format!(
                    "input holds {} {} elements, expected {} x {} {}: size it world_size x output",
                    input.len(),
                    input.dtype(),
                    self.world,
                    output.len(),
                    output.dtype()
                ),
            ))
        } else {
            self.fits(name, input.dtype(), input.len(), input.len())
                .and_then(|()| self.read(input))
        };
        let call = Call {
            aux: op_code(op),
            ..Call::new(name, input.dtype(), input.len())
        };
        let world = self.world;
        let chunk = self.collective(call, prepared, |comm, host| Ok(reduce_chunk(comm, &host, op, world)))?;
        self.write(output, &chunk)
    }

    /// A header (dtype, length), then the data; returns once MPI has taken the buffer.
    fn send(&self, buf: &BufferRef, to: usize) -> Result<()> {
        let op = "send";
        check_peer(op, self.rank, self.world, to)?;
        self.fits(op, buf.dtype(), buf.len(), buf.len() * buf.dtype().size_in_bytes())?;
        let host = self.read(buf)?;
        self.with_comm(op, |comm| {
            crate::point_to_point::send(comm, to, &host);
            Ok(())
        })
    }

    fn recv(&self, buf: &BufferRef, from: usize) -> Result<()> {
        let op = "recv";
        check_peer(op, self.rank, self.world, from)?;
        let host = self.with_comm(op, |comm| crate::point_to_point::recv(comm, from))?;
        if host.dtype() != buf.dtype() || host.len() != buf.len() {
            return Err(self.err(
                op,
                format!(
                    "rank {from} sent {} {} elements, this buffer holds {} {}",
                    host.len(),
                    host.dtype(),
                    buf.len(),
                    buf.dtype()
                ),
            ));
        }
        self.write(buf, &host)
    }

    fn barrier(&self) -> Result<()> {
        self.collective(Call::bare("barrier"), Ok(()), |comm, ()| {
            comm.barrier();
            Ok(())
        })
    }
}

impl Drop for MpiCommunicator {
    fn drop(&mut self) {
        let finalized = self.session.finalized.read().unwrap_or_else(PoisonError::into_inner);
        let comm = self.comm.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if *finalized {
            // MPI_Finalize already released it; MPI_Comm_free now would be an MPI error.
            std::mem::forget(comm);
        } else {
            drop(comm);
        }
    }
}
