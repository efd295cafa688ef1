//! Recording many dispatches per submission: wgpu's per-submit cost is large, so commands
//! accumulate in one encoder (in one open compute pass where possible) and go to the GPU when a
//! result is read back, the parameter arena fills up, an upload must be ordered after recorded
//! work, or `SUBMIT_EVERY` commands are recorded (so the GPU starts while the CPU records on).
//! At most `IN_FLIGHT` submissions run ahead of the CPU (`in_flight`).
//!
//! Each dispatch's parameters are appended to a host-side arena that is written to one device
//! buffer just before the submit and bound at a dynamic offset, so a dispatch costs no buffer of
//! its own, and its bind group is reused from step to step (`bind_groups`).

use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_core::Result;
use lockstep_core::backend::KernelTime;

use crate::bind_groups::BindGroups;
use crate::bind_layout::PARAMS_WINDOW;
use crate::buffer::WgpuBuffer;
use crate::gpu::Gpu;
use crate::in_flight::InFlight;
use crate::kernel_timer::KernelTimer;
use crate::meter::Timer;
use crate::pipelines::Pipeline;

/// Parameter bytes per submission (a dispatch uses 256 at most with alignment).
const ARENA_BYTES: u64 = 1 << 20;

/// Commands per submission at most: a few training steps of a small model.
const SUBMIT_EVERY: usize = 128;

/// Submissions the GPU may still be working on while the CPU records more.
const IN_FLIGHT: usize = 3;

/// Work recorded since the device opened, for benchmarks that report it per training step.
/// Atomics, so reading them takes no batch lock.
#[derive(Debug, Default)]
pub struct Recorded {
    pub dispatches: AtomicU64,
    pub bind_groups: AtomicU64,
    /// Reads back and synchronizes: waits for all submitted work.
    pub host_waits: AtomicU64,
}

pub struct Batch {
    /// Counts submissions; buffers remember the batch that last bound them.
    id: u64,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u32>,
    arena: wgpu::Buffer,
    align_words: usize,
    commands: usize,
    timer: Option<Timer>,
    /// Since `Backend::profile_kernels` was first started; while it is on, each dispatch gets a
    /// timed pass.
    kernel_timer: Option<KernelTimer>,
    bind_groups: BindGroups,
    in_flight: InFlight<wgpu::SubmissionIndex>,
}

impl Batch {
    pub fn new(gpu: &Gpu) -> Batch {
        let arena = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("lockstep params"),
            size: ARENA_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Batch {
            id: 1,
            encoder: None,
            pass: None,
            params: Vec::new(),
            arena,
            align_words: (gpu.limits.min_storage_buffer_offset_alignment as usize / 4).max(1),
            commands: 0,
            timer: Timer::new(gpu),
            kernel_timer: None,
            bind_groups: BindGroups::default(),
            in_flight: InFlight::new(IN_FLIGHT),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn timed(&self) -> bool {
        self.timer.is_some()
    }

    fn encoder(&mut self, gpu: &Gpu) -> &mut wgpu::CommandEncoder {
        if self.encoder.is_none() {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            if let Some(timer) = &mut self.timer {
                timer.start(&mut encoder);
            }
            self.encoder = Some(encoder);
        }
        self.encoder.as_mut().expect("created above")
    }

    /// Records one dispatch of `pipeline` with `params` at binding 0 and `buffers` at their
    /// bindings, counting it and any bind group it had to create in `recorded` (an empty grid
    /// records neither).
    pub fn dispatch(
        &mut self,
        gpu: &Gpu,
        recorded: &Recorded,
        pipeline: &Pipeline,
        params: &[u32],
        buffers: &[(u32, &WgpuBuffer)],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        if (params.len() * 4) as u64 > PARAMS_WINDOW {
            return Err(gpu.error(format!(
                "a dispatch of {} has {} parameter words, more than the {} its binding holds",
                pipeline.label,
                params.len(),
                PARAMS_WINDOW / 4
            )));
        }
        let timer_full = self.kernel_timer.as_ref().is_some_and(|t| t.on && t.full());
        if self.commands >= SUBMIT_EVERY || timer_full {
            self.submit(gpu, false)?;
        }
        let mut offset = self.params.len().next_multiple_of(self.align_words);
        if (offset * 4) as u64 + PARAMS_WINDOW > ARENA_BYTES {
            self.submit(gpu, false)?;
            offset = 0;
        }
        self.params.resize(offset, 0);
        self.params.extend_from_slice(params);
        let (bind_group, created) =
            self.bind_groups
                .get(&gpu.device, &pipeline.bind_group_layout, &self.arena, buffers);
        if created {
            recorded.bind_groups.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(mut timer) = self.kernel_timer.take_if(|t| t.on) {
            // A pass of its own, its beginning and end timed.
            self.pass = None;
            let pass = self.encoder(gpu).begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(timer.writes(&pipeline.label)),
            });
            self.pass = Some(pass.forget_lifetime());
            self.kernel_timer = Some(timer);
        } else if self.pass.is_none() {
            let pass = self
                .encoder(gpu)
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            self.pass = Some(pass);
        }
        let pass = self.pass.as_mut().expect("opened above");
        pass.set_pipeline(&pipeline.compute);
        // The offset is below ARENA_BYTES (1 MiB), so it fits in u32.
        pass.set_bind_group(0, &bind_group, &[(offset * 4) as u32]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        recorded.dispatches.fetch_add(1, Ordering::Relaxed);
        for (_, b) in buffers {
            self.touch(b);
        }
        self.commands += 1;
        Ok(())
    }

    /// Records a buffer-to-buffer copy (closing the open compute pass).
    pub fn copy(&mut self, gpu: &Gpu, src: &wgpu::Buffer, src_offset: u64, dst: &wgpu::Buffer, bytes: u64) {
        self.pass = None;
        self.encoder(gpu).copy_buffer_to_buffer(src, src_offset, dst, 0, bytes);
        self.commands += 1;
    }

    /// Marks `b` as used by this batch: an upload into it must first submit the batch.
    pub fn touch(&self, b: &WgpuBuffer) {
        b.last_batch.store(self.id, Ordering::Relaxed);
    }

    /// Submits everything recorded so far. A wait for the GPU that this needs (back-pressure)
    /// fails only when the device is lost, which `Gpu` keeps and the next call's check returns.
    pub fn flush(&mut self, gpu: &Gpu) {
        if self.commands == 0 {
            return;
        }
        let _ = self.submit(gpu, false);
    }

    /// Submits everything recorded so far with the busy timer's results, and returns the GPU
    /// time of the submissions since the last sync once they complete (call after waiting).
    pub fn flush_for_sync(&mut self, gpu: &Gpu) -> bool {
        let timed = self.timer.as_ref().is_some_and(|t| t.has_work()) || self.commands > 0;
        if timed {
            let _ = self.submit(gpu, true);
        }
        timed
    }

    /// Starts timing each dispatch on its own (a fresh tally), or stops; false where the adapter
    /// has no timestamp queries.
    pub fn profile_kernels(&mut self, gpu: &Gpu, on: bool) -> Result<bool> {
        self.submit(gpu, false)?;
        if on {
            self.kernel_timer = KernelTimer::new(gpu);
            return Ok(self.kernel_timer.is_some());
        }
        if let Some(timer) = self.kernel_timer.as_mut() {
            timer.on = false;
        }
        Ok(true)
    }

    /// The kernel times since `profile_kernels` last started, after submitting and timing what
    /// is recorded (empty if it never started).
    pub fn kernel_times(&mut self, gpu: &Gpu) -> Result<Vec<KernelTime>> {
        self.submit(gpu, false)?;
        Ok(self.kernel_timer.as_ref().map(KernelTimer::times).unwrap_or_default())
    }

    /// Every submission has completed (the caller waited for all work).
    pub fn all_done(&mut self) {
        self.in_flight.all_done();
    }

    /// Forgets every cached bind group, so that buffers the pool dropped are freed.
    pub fn forget_bind_groups(&mut self) {
        self.bind_groups.clear();
    }

    /// The busy time recorded up to the last `flush_for_sync`, once its work has completed.
    pub fn read_busy_ns(&mut self, gpu: &Gpu) -> Option<f64> {
        self.timer.as_mut()?.read(gpu)
    }

    /// Submits the recorded commands, then waits for the oldest submissions beyond `IN_FLIGHT`.
    fn submit(&mut self, gpu: &Gpu, resolve_timer: bool) -> Result<()> {
        self.pass = None;
        let mut encoder = match self.encoder.take() {
            Some(e) => e,
            None => gpu.device.create_command_encoder(&Default::default()),
        };
        if let Some(timer) = &mut self.timer {
            timer.stop(&mut encoder);
            if resolve_timer {
                timer.resolve(&mut encoder);
            }
        }
        let kernels_timed = self.kernel_timer.as_ref().is_some_and(|t| t.resolve(&mut encoder));
        // write_buffer lands before this submission's commands and after every earlier one.
        gpu.queue
            .write_buffer(&self.arena, 0, bytemuck::cast_slice(&self.params));
        let submission = gpu.queue.submit([encoder.finish()]);
        self.params.clear();
        self.commands = 0;
        self.id += 1;
        if kernels_timed && let Some(timer) = self.kernel_timer.as_mut() {
            // Waits for this submission: profiling runs one submission at a time.
            timer.read(gpu)?;
        }
        for oldest in self.in_flight.submitted(submission) {
            gpu.wait_for(oldest)?;
        }
        Ok(())
    }
}
