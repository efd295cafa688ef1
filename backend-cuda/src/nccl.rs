//! Collectives on NCCL: all GPUs of one process (one communicator per device from
//! `ncclCommInitAll`, each driven by its own thread) or one process per GPU (`ncclCommInitRank`
//! with an id rank 0 created and the launcher handed over).
//!
//! A collective runs on its communicator's own stream, after the work already queued on the
//! compute stream (an event), and marks its buffers pending: the compute stream waits for it
//! only when it next touches them, so a bucket's all-reduce overlaps the rest of backward. Each
//! communicator has its own stream because NCCL kernels wait for their peers': two
//! communicators sharing a stream (the gradients' on the communication thread, SyncBatchNorm's
//! on the training thread) would be ordered by a thread race that can differ between ranks, a
//! cyclic wait.
//! NCCL calls do not fail when a peer dies, they hang: every collective also checks NCCL's
//! asynchronous error and how long the oldest unfinished one has been running, and past the
//! timeout (10 minutes by default) aborts the communicator with an error naming the op.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result, sys};

use lockstep_core::backend::{BackendBuffer, BufferRef, Communicator, ReduceOp};
use lockstep_core::{DType, Device, Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::nccl_handle::CommHandle;
use crate::probe;

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
    comm: CommHandle,
    /// This communicator's own stream (see the module's doc).
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    backend: Arc<CudaBackend>,
    timeout: Duration,
    /// Collectives queued and not yet seen complete, oldest first.
    outstanding: Mutex<VecDeque<(Arc<CudaEvent>, Instant, &'static str)>>,
}

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
            .map(|(rank, (comm, backend))| NcclCommunicator::wrap(comm, rank, world, backend))
            .collect()
    }

    /// Rank `rank` of `world` processes, one GPU each; blocks until every rank has joined.
    pub fn from_rank(device: &Device, rank: usize, world: usize, id: &NcclId) -> Result<NcclCommunicator> {
        require_nccl(rank, "init")?;
        let backend = cuda_backend(device)?;
        backend.gpu.enter()?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the handle; this thread's current context is the device's.
        unsafe { result::comm_init_rank(&mut comm, world as i32, id.0, rank as i32) }
            .map_err(|e| nccl_error("init", rank, "ncclCommInitRank", e))?;
        NcclCommunicator::wrap(comm, rank, world, backend)
    }

    fn wrap(comm: sys::ncclComm_t, rank: usize, world: usize, backend: Arc<CudaBackend>) -> Result<NcclCommunicator> {
        let comm = CommHandle::new(comm);
        let stream = match backend.gpu.new_comm_stream() {
            Ok(stream) => stream,
            Err(e) => {
                // SAFETY: the handle is live and used nowhere else yet.
                comm.abort("no stream", |c| drop(unsafe { result::comm_abort(c) }));
                return Err(e);
            }
        };
        Ok(NcclCommunicator {
            comm,
            stream,
            rank,
            world,
            backend,
            timeout: Duration::from_secs(600),
            outstanding: Mutex::default(),
        })
    }

    /// How long a collective may run before the communicator is aborted (default 10 minutes).
    pub fn with_timeout(mut self, timeout: Duration) -> NcclCommunicator {
        self.timeout = timeout;
        self
    }

    fn err(&self, op: &'static str, msg: impl Into<String>) -> Error {
        Error::Collective {
            op,
            rank: self.rank,
            msg: msg.into(),
        }
    }

    fn buffer<'a>(&self, op: &'static str, b: &'a BufferRef) -> Result<&'a CudaBuffer> {
        self.backend.operand(op, b, None)
    }

    /// Runs `call(comm, stream)` on the communication stream after the compute stream's queued
    /// work, then marks `touched` pending on it.
    fn enqueue(
        &self,
        op: &'static str,
        touched: &[&CudaBuffer],
        call: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> std::result::Result<result::NcclStatus, result::NcclError>,
    ) -> Result<()> {
        self.check_progress(op)?;
        let gpu = &self.backend.gpu;
        let fail = |what: &str, e: cudarc::driver::DriverError| self.err(op, format!("{what}: {e:?}"));
        let queued = gpu.compute.record_event(None).map_err(|e| fail("event", e))?;
        self.stream.wait(&queued).map_err(|e| fail("stream wait", e))?;
        self.comm
            .with(|comm| call(comm, self.stream.cu_stream() as _))
            .map_err(|why| self.aborted(op, &why))?
            .map_err(|e| nccl_error(op, self.rank, op, e))?;
        let done = Arc::new(self.stream.record_event(None).map_err(|e| fail("event", e))?);
        for b in touched {
            b.set_pending(done.clone());
        }
        self.outstanding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((done, Instant::now(), op));
        Ok(())
    }

    /// Drops finished collectives; errors (and aborts) on NCCL's asynchronous error or when
    /// the oldest unfinished one has run past the timeout.
    fn check_progress(&self, op: &'static str) -> Result<()> {
        let mut outstanding = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((event, _, running)) = outstanding.front() {
            match event.try_is_complete() {
                Ok(true) => drop(outstanding.pop_front()),
                Ok(false) => break,
                // A kernel fault, not a peer: say so now instead of waiting out the timeout.
                Err(e) => {
                    let why = format!("the GPU reported {e:?} while {running} ran (a kernel failed on this device)");
                    drop(outstanding);
                    return Err(self.fail(op, why));
                }
            }
        }
        let mut async_error = sys::ncclResult_t::ncclSuccess;
        // SAFETY: the handle is live (checked by `with`); NCCL writes one result code.
        self.comm
            .with(|comm| unsafe { sys::ncclCommGetAsyncError(comm, &mut async_error) })
            .map_err(|why| self.aborted(op, &why))?;
        if async_error != sys::ncclResult_t::ncclSuccess {
            drop(outstanding);
            return Err(self.fail(
                op,
                format!("NCCL reported {async_error:?} (a peer failed or the network dropped)"),
            ));
        }
        if let Some((_, since, stuck)) = outstanding.front()
            && since.elapsed() > self.timeout
        {
            let why = format!(
                "{stuck} did not complete within {:?}: another rank died or stopped calling collectives",
                self.timeout
            );
            drop(outstanding);
            return Err(self.fail(op, why));
        }
        Ok(())
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

    /// Waits, with the timeout, for every queued collective.
    fn wait_all(&self, op: &'static str) -> Result<()> {
        loop {
            self.check_progress(op)?;
            if self.outstanding.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
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
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
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

    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(self.err("broadcast", format!("root {root} is not a rank of {}", self.world)));
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
        if o.len() != i.len() * self.world {
            return Err(self.err(
                "all_gather",
                format!("output holds {} elements, not {} x {}", o.len(), self.world, i.len()),
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
        if i.len() != o.len() * self.world {
            return Err(self.err(
                "reduce_scatter",
                format!("input holds {} elements, not {} x {}", i.len(), self.world, o.len()),
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

    fn barrier(&self) -> Result<()> {
        let token = lockstep_core::backend::Backend::zeros(self.backend.as_ref(), DType::F32, 1)?;
        self.all_reduce(&token, ReduceOp::Sum)?;
        self.wait_all("barrier")
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        let _ = self.backend.gpu.enter();
        let _ = self.stream.synchronize();
        // SAFETY: `abort` hands over the handle only if no failure freed it already.
        self.comm.abort("dropped", |c| drop(unsafe { result::comm_abort(c) }));
    }
}
