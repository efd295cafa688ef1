//! One opened CUDA device: its context, a compute stream and its communicators' streams, the
//! kernels compiled for its architecture (each file loaded once, on first use, and each entry
//! point kept in a slot that launches read without a lock), cuBLAS, cuDNN, pinned staging memory
//! for uploads, and device memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, LaunchConfig, sys};
use cudarc::nvrtc::Ptx;

use lockstep_core::backend::WorkCounters;
use lockstep_core::{DType, Error, Result};
use lockstep_kernels::KernelSource;

use crate::blas::Blas;
use crate::buffer::CudaBuffer;
use crate::dnn::Dnn;
use crate::entry_points::{self, EntryPoint};
use crate::error::driver_error;
use crate::memory::Memory;
use crate::profiler::Profiler;
use crate::staging::Staging;
use crate::wait;

/// Threads per block of every 1-D kernel (the grid-stride loops cover any size).
pub(crate) const BLOCK: u32 = 256;

pub struct Gpu {
    pub(crate) location: String,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) compute: Arc<CudaStream>,
    /// This device's NCCL communicators (see nccl.rs): `synchronize` waits for their streams,
    /// and every wait checks their collectives' timeouts.
    comms: Mutex<Vec<Weak<dyn CollectiveWatch>>>,
    /// `sm_90` for compute capability 9.0.
    pub(crate) arch: String,
    sm_count: u32,
    /// Loaded kernel files by `KernelSource::name`: a file holds many entry points and is
    /// compiled (or read from the disk cache) and loaded once, not once per entry.
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Each entry point's function, in its `EntryPoint::slot`, loaded at its first launch. Per
    /// device: a function belongs to the context that loaded it.
    functions: Box<[OnceLock<CudaFunction>]>,
    pub(crate) memory: Arc<Memory>,
    pub(crate) blas: Blas,
    /// cuDNN, opened at the first convolution; `None` inside where it is absent or turned off.
    dnn: OnceLock<Option<Dnn>>,
    pub(crate) staging: Staging,
    /// Kernels launched and cuBLAS products queued, for `lockstep bench`'s launches per step.
    pub(crate) kernels_launched: AtomicU64,
    pub(crate) blas_calls: AtomicU64,
    /// Downloads and synchronizes: waits for all the queued work.
    pub(crate) host_waits: AtomicU64,
    /// Each launch timed alone while `Backend::profile_kernels` is on.
    pub(crate) profiler: Profiler,
}

impl Gpu {
    pub(crate) fn open(ordinal: usize) -> Result<Gpu> {
        let location = format!("cuda:{ordinal}");
        crate::probe::require_compute_libraries(&location)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error(&location, "could not open the device", e))?;
        // Streams are ordered by our own events (see `CudaBuffer::ready`), not cudarc's tracking.
        // SAFETY: called before any slice exists on this context; we never use CudaSlice.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_error(&location, "compute capability", e))?;
        let compute = ctx.new_stream().map_err(|e| driver_error(&location, "stream", e))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1)
            .max(1) as u32;
        let memory = Arc::new(Memory::new(location.clone(), compute.clone()));
        let blas = Blas::new(&location, &compute)?;
        Ok(Gpu {
            staging: Staging::new(location.clone(), ctx.clone()),
            location,
            arch: format!("sm_{major}{minor}"),
            sm_count,
            modules: Mutex::default(),
            functions: (0..entry_points::SLOTS).map(|_| OnceLock::new()).collect(),
            kernels_launched: AtomicU64::new(0),
            blas_calls: AtomicU64::new(0),
            host_waits: AtomicU64::new(0),
            profiler: Profiler::default(),
            memory,
            blas,
            dnn: OnceLock::new(),
            comms: Mutex::default(),
            compute,
            ctx,
        })
    }

    /// cuDNN on the compute stream, opened on first use; `None` without it (a failure to open
    /// it is reported once, and convolutions unfold instead).
    pub(crate) fn dnn(&self) -> Option<&Dnn> {
        self.dnn
            .get_or_init(|| match Dnn::open(&self.location, &self.compute) {
                Ok(dnn) => dnn,
                Err(e) => {
                    eprintln!(
                        "warning: {e}; convolutions on {} unfold instead (im2col and cuBLAS)",
                        self.location
                    );
                    None
                }
            })
            .as_ref()
    }

    /// Makes this device's context current on the calling thread (raw driver calls need it).
    pub(crate) fn enter(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error(&self.location, "binding the context", e))
    }

    pub(crate) fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        crate::views::check_len("alloc", len)?;
        self.enter()?;
        CudaBuffer::new(dtype, len, self.memory.clone(), self.compute.clone())
    }

    /// The function of `entry` on this device: after its first launch, one read of its slot
    /// (no lock, no allocation).
    pub(crate) fn function(&self, entry: EntryPoint) -> Result<&CudaFunction> {
        let slot = &self.functions[entry.slot];
        if let Some(f) = slot.get() {
            return Ok(f);
        }
        let f = self.load(entry)?;
        // Two threads may both have loaded it: the first to store wins, the other's copy is dropped.
        Ok(slot.get_or_init(|| f))
    }

    /// Loads `entry`, compiling or loading its file on the first use of any of its entries.
    #[cold]
    fn load(&self, entry: EntryPoint) -> Result<CudaFunction> {
        let module = self.module(entry.file)?;
        module.load_function(entry.name).map_err(|e| {
            driver_error(
                &self.location,
                &format!("kernel {} is missing from kernels/{}.cu", entry.name, entry.file.name),
                e,
            )
        })
    }

    /// The module of kernel file `kernel`, compiled (or read from the disk cache) and loaded on
    /// first use.
    fn module(&self, kernel: KernelSource) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(kernel.name) {
            return Ok(module.clone());
        }
        let cubin = lockstep_kernels::compile_cached(&kernel, &self.arch).map_err(|e| Error::Device {
            device: self.location.clone(),
            msg: e.to_string(),
        })?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| driver_error(&self.location, &format!("loading kernels/{}.cu", kernel.name), e))?;
        modules.insert(kernel.name, module.clone());
        Ok(module)
    }

    /// A grid of `BLOCK`-thread blocks for `n` elements: enough blocks to fill the device a few
    /// times over, the grid-stride loop doing the rest.
    pub(crate) fn grid(&self, n: usize) -> LaunchConfig {
        let wanted = n.div_ceil(BLOCK as usize).max(1);
        let cap = (self.sm_count as usize) * 32;
        LaunchConfig {
            grid_dim: (wanted.min(cap) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A grid for `rows` rows of `cols` elements (grid y walks the rows, x the columns), about as
    /// many blocks in all as `grid`.
    pub(crate) fn rows_grid(&self, rows: usize, cols: usize) -> LaunchConfig {
        let cap = (self.sm_count as usize) * 32;
        let y = rows.clamp(1, u16::MAX as usize);
        let x = (cap / y).clamp(1, cols.div_ceil(BLOCK as usize).max(1));
        LaunchConfig {
            grid_dim: (x as u32, y as u32, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Exactly `blocks` blocks of `BLOCK` threads (kernels that map blocks to outputs).
    pub(crate) fn blocks(&self, blocks: usize) -> Result<LaunchConfig> {
        Ok(LaunchConfig {
            grid_dim: (crate::views::to_u32("launch", blocks.max(1))?, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    pub(crate) fn work_counters(&self) -> WorkCounters {
        WorkCounters {
            kernels: Some(self.kernels_launched.load(Ordering::Relaxed)),
            library_calls: Some(self.blas_calls.load(Ordering::Relaxed)),
            host_waits: Some(self.host_waits.load(Ordering::Relaxed)),
        }
    }

    /// Runs `queue` (a kernel launch, or work a library queues: cuBLAS, cuDNN) on the compute
    /// stream, timed alone as `name` while kernels are profiled.
    pub(crate) fn timed<T>(&self, name: &'static str, queue: impl FnOnce() -> Result<T>) -> Result<T> {
        let timing = self.profiler.start(&self.location, &self.compute)?;
        let queued = queue()?;
        self.profiler.finish(timing, name, &self.location, &self.compute)?;
        Ok(queued)
    }

    pub(crate) fn launch_failed(&self, entry: &str, e: cudarc::driver::DriverError) -> Error {
        driver_error(&self.location, &format!("launching {entry}"), e)
    }

    /// A new stream for one communicator's collectives.
    pub(crate) fn new_comm_stream(&self) -> Result<Arc<CudaStream>> {
        self.enter()?;
        self.ctx
            .new_stream()
            .map_err(|e| driver_error(&self.location, "stream", e))
    }

    /// Makes `synchronize` wait for `comm`'s stream and every wait check its collectives.
    pub(crate) fn watch(&self, comm: Weak<dyn CollectiveWatch>) {
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.retain(|c| c.strong_count() > 0);
        comms.push(comm);
    }

    fn watched(&self) -> Vec<Arc<dyn CollectiveWatch>> {
        let comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.iter().filter_map(Weak::upgrade).collect()
    }

    /// Waits for the work queued on `stream` so far by polling an event, never in
    /// cuStreamSynchronize: that work may wait for a collective whose peer died, and between
    /// polls every communicator of this device checks its collectives, so the wait ends in
    /// their timeout error (naming the ranks) instead of a hang.
    pub(crate) fn wait_for(&self, stream: &CudaStream, what: &str) -> Result<()> {
        self.enter()?;
        if self.watched().is_empty() {
            // No collective to wait for, so no peer to hang on: the driver's wait is cheapest.
            return stream.synchronize().map_err(|e| driver_error(&self.location, what, e));
        }
        let queued = stream
            .record_event(None)
            .map_err(|e| driver_error(&self.location, what, e))?;
        self.wait_event(&queued, what)
    }

    /// Waits for `event` as `wait_for` waits for a stream: polling, with the communicators'
    /// timeouts checked between polls.
    pub(crate) fn wait_event(&self, event: &CudaEvent, what: &str) -> Result<()> {
        self.enter()?;
        let fail = |e| driver_error(&self.location, what, e);
        let comms = self.watched();
        if comms.is_empty() {
            return event.synchronize().map_err(fail);
        }
        wait::poll_until(
            || event.try_is_complete().map_err(fail),
            || comms.iter().try_for_each(|c| c.check()),
        )
    }

    /// Waits for everything queued on the compute stream and every communicator's stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.host_waits.fetch_add(1, Ordering::Relaxed);
        for comm in self.watched() {
            self.wait_for(comm.stream(), "synchronize")?;
        }
        self.wait_for(&self.compute, "synchronize")
    }
}

/// A communicator as the device's waits see it.
pub(crate) trait CollectiveWatch: Send + Sync {
    /// The stream its collectives run on.
    fn stream(&self) -> &CudaStream;
    /// Errs, aborting the communicator, once a queued collective failed or ran past its
    /// timeout.
    fn check(&self) -> Result<()>;
}

/// Launches `entry` (an `EntryPoint`) on the compute stream with the given config and arguments
/// (each pushed by reference, as cudarc's builder wants).
macro_rules! launch {
    ($gpu:expr, $entry:expr, $cfg:expr; $($arg:expr),+ $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let gpu: &$crate::gpu::Gpu = $gpu;
        let entry: $crate::entry_points::EntryPoint = $entry;
        let function = gpu.function(entry)?;
        gpu.timed(entry.name, || {
            // One expression, so temporaries among the arguments live until the launch is queued.
            // SAFETY: the arguments match the kernel's C signature in kernels/cuda (device
            // pointers as u64, counts as u32, views as the #[repr(C)] structs of views.rs); every
            // pointer is a live allocation of at least the extent the kernel indexes, checked by
            // the caller; the kernel runs on the compute stream, which orders it with every other
            // use.
            unsafe { gpu.compute.launch_builder(function)$(.arg($arg))+.launch($cfg) }
                .map_err(|e| gpu.launch_failed(entry.name, e))
        })?;
        gpu.kernels_launched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }};
}
pub(crate) use launch;
