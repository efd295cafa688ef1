//! Collectives and point-to-point messages on NCCL: all GPUs of one process (one communicator per device from
//! `ncclCommInitAll`, each driven by its own thread) or one process per GPU
//! (`ncclCommInitRankConfig` with an id rank 0 created and the launcher handed over).
//!
//! A collective runs on its communicator's own stream, after the work already queued on the
//! compute stream (an event), and marks its buffers pending: the compute stream waits for it
//! only when it next touches them, so a bucket's all-reduce overlaps the rest of backward. Each
//! communicator has its own stream because NCCL kernels wait for their peers': two
//! communicators sharing a stream (the gradients' on the communication thread, SyncBatchNorm's
//! on the training thread) would be ordered by a thread race that can differ between ranks, a
//! cyclic wait.
//! NCCL calls do not fail when a peer dies, they hang: every collective, and every wait of the
//! device (`Gpu::wait_for`: downloads, `synchronize`), polls NCCL's asynchronous error and how
//! long the oldest unfinished collective has been running, and past the timeout (10 minutes by
//! default) aborts the communicator with an error naming the op and the ranks waited for. The
//! host never blocks where a peer could hold it: joining is non-blocking (nccl_init.rs) and
//! waits poll events (wait.rs). Two timing events around each collective measure it on the
//! device (`take_collective_time`): the host only sees it queued.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result, sys};

use lockstep_core::backend::{BackendBuffer, BufferRef, Communicator, ReduceOp, check_peer};
use lockstep_core::{DType, Device, Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::gpu::CollectiveWatch;
use crate::in_flight::{Completion, InFlight, Stalled};
use crate::nccl_handle::CommHandle;
use crate::nccl_init::{self, Unsettled};
use crate::probe;
use crate::wait::{self, Deadline};

/// The 128 bytes that let ranks of one job find each other (ncclUniqueId).
#[derive(Clone, Copy)]
pub struct NcclId(sys::ncclUniqueId);

impl NcclId {
    /// A fresh id (rank 0 makes it; the launcher's rendezvous hands it to the others).
    pub fn new() -> Result<NcclId> {
        require_nccl(0, "id")?;
        result::get_uniqueid()
            .map(NcclId)
            .map_err(|e| nccl_error("id", 0, "ncclGetUniqueId", e))
    }
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId> {
        let bytes: [u8; 128] = bytes
            .try_into()
            .map_err(|_| Error::invalid("nccl id", format!("an NCCL id is 128 bytes, got {}", bytes.len())))?;
        Ok(NcclId(sys::ncclUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        }))
    }
}

pub struct NcclCommunicator {
    state: Arc<CommState>,
    backend: Arc<CudaBackend>,
}

/// The part of a communicator its device's waits also check (`Gpu::wait_for`).
struct CommState {
    comm: CommHandle,
    /// This communicator's own stream (see the module's doc).
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    /// Collectives queued and not yet seen complete, oldest first, and the timeout.
    in_flight: Mutex<InFlight<Timed>>,
}

/// A collective's events on the communicator's stream: `start` once its inputs are ready (the
/// compute stream's work before it done), `done` after it; between them it runs, waiting for
/// its peers included.
struct Timed {
    start: CudaEvent,
    done: Arc<CudaEvent>,
}

impl Completion for Timed {
    fn finished(&self) -> std::result::Result<bool, String> {
        self.done.try_is_complete().map_err(|e| format!("{e:?}"))
    }
    fn device_time(&self) -> Duration {
        let ms = self.start.elapsed_ms(&self.done).unwrap_or(0.0);
        Duration::try_from_secs_f32(ms / 1000.0).unwrap_or_default()
    }
}

/// How long a collective (and joining a communicator) may take before it is aborted.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

fn require_nccl(rank: usize, op: &'static str) -> Result<()> {
    if probe::nccl_present() {
        return Ok(());
    }
    let remedy = probe::libraries()
        .into_iter()
        .find(|l| l.name == "NCCL")
        .map(|l| l.remedy)
        .unwrap_or("");
    Err(Error::Collective {
        op,
        rank,
        msg: format!("NCCL library not found (libnccl.so): {remedy}"),
    })
}

fn nccl_error(op: &'static str, rank: usize, call: &str, e: result::NcclError) -> Error {
    Error::Collective {
        op,
        rank,
        msg: format!("{call} failed: {:?}", e.0),
    }
}

fn cuda_backend(device: &Device) -> Result<Arc<CudaBackend>> {
    crate::backend_of(device).ok_or_else(|| {
        Error::invalid(
            "nccl",
            format!("{device} is not an opened CUDA device; NCCL runs on cuda:N only"),
        )
    })
}

impl NcclCommunicator {
    /// One communicator per device of this process, rank i on `devices[i]`; drive each from its
    /// own thread.
    pub fn group(devices: &[Device]) -> Result<Vec<NcclCommunicator>> {
        require_nccl(0, "init")?;
        let backends: Vec<Arc<CudaBackend>> = devices.iter().map(cuda_backend).collect::<Result<_>>()?;
        let ordinals: Vec<i32> = backends.iter().map(|b| b.gpu.ctx.ordinal() as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device in `ordinals`.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), ordinals.len() as i32, ordinals.as_ptr()) }
            .map_err(|e| nccl_error("init", 0, "ncclCommInitAll", e))?;
        let world = devices.len();
        comms
            .into_iter()
            .zip(backends)
            .enumerate()
            .map(|(rank, (comm, backend))| NcclCommunicator::wrap(comm, rank, world, backend, DEFAULT_TIMEOUT))
            .collect()
    }

    /// Rank `rank` of `world` processes, one GPU each; waits until every rank has joined, for
    /// at most the default timeout (10 minutes).
    pub fn from_rank(device: &Device, rank: usize, world: usize, id: &NcclId) -> Result<NcclCommunicator> {
        NcclCommunicator::from_rank_with_timeout(device, rank, world, id, DEFAULT_TIMEOUT)
    }

    /// As `from_rank`, with the time the join and each later collective may take: a rank that
    /// never joins is an error naming the ranks waited for, not a hang.
    pub fn from_rank_with_timeout(
        device: &Device,
        rank: usize,
        world: usize,
        id: &NcclId,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        require_nccl(rank, "init")?;
        if rank >= world || i32::try_from(world).is_err() {
            return Err(Error::invalid(
                "nccl init",
                format!("rank {rank} of {world}: a rank is one of 0..world, and world fits NCCL's int"),
            ));
        }
        let backend = cuda_backend(device)?;
        backend.gpu.enter()?;
        let comm = nccl_init::init_rank(rank, world, id.0, timeout).map_err(|(why, half_made)| {
            if let Some(comm) = half_made {
                // SAFETY: made by the failed init and never handed out; freed once, here.
                drop(unsafe { result::comm_abort(comm) });
            }
            Error::Collective {
                op: "init",
                rank,
                msg: why.describe(),
            }
        })?;
        NcclCommunicator::wrap(comm, rank, world, backend, timeout)
    }

    fn wrap(
        comm: sys::ncclComm_t,
        rank: usize,
        world: usize,
        backend: Arc<CudaBackend>,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        let comm = CommHandle::new(comm);
        let stream = match backend.gpu.new_comm_stream() {
            Ok(stream) => stream,
            Err(e) => {
                // SAFETY: the handle is live and used nowhere else yet.
                comm.abort("no stream", |c| drop(unsafe { result::comm_abort(c) }));
                return Err(e);
            }
        };
        let state = Arc::new(CommState {
            comm,
            stream,
            rank,
            world,
            in_flight: Mutex::new(InFlight::new(timeout)),
        });
        let watched: Weak<CommState> = Arc::downgrade(&state);
        backend.gpu.watch(watched);
        Ok(NcclCommunicator { state, backend })
    }

    /// How long a collective may run before the communicator is aborted (default 10 minutes).
    pub fn with_timeout(self, timeout: Duration) -> NcclCommunicator {
        self.state.in_flight().set_timeout(timeout);
        self
    }

    /// How long this communicator's collectives that finished since the last call ran on the
    /// device, each from when its inputs were ready until it finished (waiting for its peers
    /// included): the host sees only their enqueue, which takes about nothing.
    pub fn take_collective_time(&self) -> Result<Duration> {
        self.state.check_progress("collective_time")?;
        Ok(self.state.in_flight().take_device_time())
    }

    fn buffer<'a>(&self, op: &'static str, b: &'a BufferRef) -> Result<&'a CudaBuffer> {
        self.backend.operand(op, b, None)
    }

    /// Runs `call(comm, stream)` on the communication stream after the compute stream's queued
    /// work, between two timing events, then marks `touched` pending on it.
    fn enqueue(
        &self,
        op: &'static str,
        touched: &[&CudaBuffer],
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        let state = &self.state;
        state.check_progress(op)?;
        let fail = |what: &str, e: cudarc::driver::DriverError| state.err(op, format!("{what}: {e:?}"));
        let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let queued = self
            .backend
            .gpu
            .compute
            .record_event(None)
            .map_err(|e| fail("event", e))?;
        state.stream.wait(&queued).map_err(|e| fail("stream wait", e))?;
        let start = state.stream.record_event(timed).map_err(|e| fail("event", e))?;
        let deadline = Deadline::after(state.in_flight().timeout());
        let called = state
            .comm
            .with(|comm| match call(comm, state.stream.cu_stream() as _) {
                Ok(result::NcclStatus::Success) => Ok(()),
                // Non-blocking: NCCL goes on (connecting to the peers, say) and queues the
                // kernel once done; nothing else may reach the communicator until then.
                Ok(_) => nccl_init::settle(comm, op, state.rank, state.world, deadline),
                Err(e) => Err(Unsettled::Failed(op, e.0)),
            })
            .map_err(|why| state.aborted(op, &why))?;
        // This rank skipped a collective the others ran: later ones would not match up.
        called.map_err(|why| state.fail(op, why.describe()))?;
        let done = Arc::new(state.stream.record_event(timed).map_err(|e| fail("event", e))?);
        for b in touched {
            b.set_pending(done.clone());
        }
        state.in_flight().push(Timed { start, done }, op);
        Ok(())
    }
}

impl CommState {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, InFlight<Timed>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn err(&self, op: &'static str, msg: impl Into<String>) -> Error {
        Error::Collective {
            op,
            rank: self.rank,
            msg: msg.into(),
        }
    }

    /// Errs (and aborts) on NCCL's asynchronous error (a peer failed), a collective that failed
    /// on the device, or the oldest unfinished one past the timeout; retires finished ones.
    fn check_progress(&self, op: &'static str) -> Result<()> {
        let async_state = self
            .comm
            .with(nccl_init::async_state)
            .map_err(|why| self.aborted(op, &why))?;
        if !matches!(
            async_state,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            return Err(self.fail(
                op,
                format!("NCCL reported {async_state:?} (a peer failed or the network dropped)"),
            ));
        }
        let progress = self.in_flight().progress(self.rank, self.world);
        progress.map_err(|Stalled { op, why }| self.fail(op, why))
    }

    /// Aborts the communicator (so pending NCCL kernels return and streams drain) and returns
    /// the error that says why.
    fn fail(&self, op: &'static str, why: String) -> Error {
        // SAFETY: `abort` hands over the live handle once; NCCL frees it.
        self.comm.abort(&why, |c| drop(unsafe { result::comm_abort(c) }));
        self.err(op, why)
    }

    /// The error of a call made after the communicator was aborted.
    fn aborted(&self, op: &'static str, why: &str) -> Error {
        self.err(
            op,
            format!(
                "the communicator was aborted earlier ({why}); a run cannot go on after a collective failed: \
                 restart it from its last checkpoint"
            ),
        )
    }

    /// Waits, by polling with the timeout, for every queued collective.
    fn wait_all(&self, op: &'static str) -> Result<()> {
        wait::poll_until(
            || {
                self.check_progress(op)?;
                Ok(self.in_flight().is_empty())
            },
            || Ok(()),
        )
    }
}

impl CollectiveWatch for CommState {
    fn stream(&self) -> &CudaStream {
        &self.stream
    }
    fn check(&self) -> Result<()> {
        // Nothing queued, so no wait can hang on it (and a dropped one is no error).
        if self.in_flight().is_empty() {
            return Ok(());
        }
        self.check_progress("synchronize")
    }
}

fn nccl_type(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::U32 => sys::ncclDataType_t::ncclUint32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Mean => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.state.rank
    }
    /// The calls only queue the collectives: their device time is measured by events.
    fn take_device_time(&self) -> Result<Option<Duration>> {
        self.take_collective_time().map(Some)
    }
    fn world_size(&self) -> usize {
        self.state.world
    }

    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()> {
        let b = self.buffer("all_reduce", buf)?;
        let t = nccl_type(b.dtype());
        // SAFETY: in place over the buffer's `len` elements of type `t`, on the comm stream.
        self.enqueue("all_reduce", &[b], |comm, stream| unsafe {
            result::all_reduce(
                b.ptr as *const _,
                b.ptr as *mut _,
                b.len(),
                t,
                nccl_op(op),
                comm,
                stream,
            )
        })
    }

    fn reduce(&self, buf: &BufferRef, root: usize, op: ReduceOp) -> Result<()> {
        if root >= self.state.world {
            return Err(self
                .state
                .err("reduce", format!("root {root} is not a rank of {}", self.state.world)));
        }
        let b = self.buffer("reduce", buf)?;
        let t = nccl_type(b.dtype());
        // SAFETY: in place over the buffer's `len` elements of type `t`, on the comm stream;
        // NCCL writes the result on root only.
        self.enqueue("reduce", &[b], |comm, stream| unsafe {
            result::reduce(
                b.ptr as *const _,
                b.ptr as *mut _,
                b.len(),
                t,
                nccl_op(op),
                root as i32,
                comm,
                stream,
            )
        })
    }

    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        if root >= self.state.world {
            return Err(self.state.err(
                "broadcast",
                format!("root {root} is not a rank of {}", self.state.world),
            ));
        }
        let b = self.buffer("broadcast", buf)?;
        let t = nccl_type(b.dtype());
        // SAFETY: in place over the buffer's elements, on the comm stream.
        self.enqueue("broadcast", &[b], |comm, stream| unsafe {
            result::broadcast(
                b.ptr as *const _,
                b.ptr as *mut _,
                b.len(),
                t,
                root as i32,
                comm,
                stream,
            )
        })
    }

    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()> {
        let (i, o) = (self.buffer("all_gather", input)?, self.buffer("all_gather", output)?);
        self.backend.same_dtype("all_gather", i, o)?;
        if o.len() != i.len() * self.state.world {
            return Err(self.state.err(
                "all_gather",
                format!(
                    "output holds {} elements, not {} x {}",
                    o.len(),
                    self.state.world,
                    i.len()
                ),
            ));
        }
        let t = nccl_type(i.dtype());
        // SAFETY: reads `i.len()` elements, writes `world` times as many (checked above).
        self.enqueue("all_gather", &[i, o], |comm, stream| unsafe {
            result::all_gather(i.ptr as *const _, o.ptr as *mut _, i.len(), t, comm, stream)
        })
    }

    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()> {
        let (i, o) = (
            self.buffer("reduce_scatter", input)?,
            self.buffer("reduce_scatter", output)?,
        );
        self.backend.same_dtype("reduce_scatter", i, o)?;
        if i.len() != o.len() * self.state.world {
            return Err(self.state.err(
                "reduce_scatter",
                format!(
                    "input holds {} elements, not {} x {}",
                    i.len(),
                    self.state.world,
                    o.len()
                ),
            ));
        }
        let t = nccl_type(i.dtype());
        // SAFETY: reads `world * o.len()` elements, writes `o.len()` (checked above).
        self.enqueue("reduce_scatter", &[i, o], |comm, stream| unsafe {
            result::reduce_scatter(
                i.ptr as *const _,
                o.ptr as *mut _,
                o.len(),
                t,
                nccl_op(op),
                comm,
                stream,
            )
        })
    }

    /// ncclSend of the whole buffer; rank `to` must post a `recv` of the same dtype and length
    /// (NCCL cannot check it: a mismatch hangs or corrupts, as it would in PyTorch).
    fn send(&self, buf: &BufferRef, to: usize) -> Result<()> {
        check_peer("send", self.state.rank, self.state.world, to)?;
        let b = self.buffer("send", buf)?;
        let t = nccl_type(b.dtype());
        // SAFETY: reads the buffer's `len` elements of type `t`, on the comm stream.
        self.enqueue("send", &[b], |comm, stream| unsafe {
            result::send(b.ptr as *const _, b.len(), t, to as i32, comm, stream)
        })
    }

    /// ncclRecv into the whole buffer, from rank `from`'s matching `send`.
    fn recv(&self, buf: &BufferRef, from: usize) -> Result<()> {
        check_peer("recv", self.state.rank, self.state.world, from)?;
        let b = self.buffer("recv", buf)?;
        let t = nccl_type(b.dtype());
        // SAFETY: writes the buffer's `len` elements of type `t`, on the comm stream.
        self.enqueue("recv", &[b], |comm, stream| unsafe {
            result::recv(b.ptr as *mut _, b.len(), t, from as i32, comm, stream)
        })
    }

    fn barrier(&self) -> Result<()> {
        let token = lockstep_core::backend::Backend::zeros(self.backend.as_ref(), DType::F32, 1)?;
        self.all_reduce(&token, ReduceOp::Sum)?;
        self.state.wait_all("barrier")
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        let _ = self.backend.gpu.enter();
        // Polled with the timeout (aborting past it), not cuStreamSynchronize: a dead peer's
        // collective would hold the drop forever.
        let _ = self.state.wait_all("drop");
        // SAFETY: `abort` hands over the handle only if no failure freed it already.
        self.state
            .comm
            .abort("dropped", |c| drop(unsafe { result::comm_abort(c) }));
    }
}
