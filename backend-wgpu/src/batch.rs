//! Recording many dispatches per submission: wgpu's per-submit cost is large, so commands
//! accumulate in one encoder (in one open compute pass where possible) and go to the GPU only
//! when a result is read back, the parameter arena fills up, or an upload must be ordered after
//! recorded work.
//!
//! Each dispatch's parameters are appended to a host-side arena that is written to one device
//! buffer just before the submit, so a dispatch costs no buffer of its own.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

use lockstep_core::Result;

use crate::buffer::WgpuBuffer;
use crate::gpu::Gpu;
use crate::meter::Timer;

/// Parameter bytes per submission (a dispatch uses 256 at most with alignment).
const ARENA_BYTES: u64 = 1 << 20;

/// Work recorded since the device opened, for benchmarks that report it per training step.
/// Atomics, so reading them takes no batch lock.
#[derive(Debug, Default)]
pub struct Recorded {
    pub dispatches: AtomicU64,
    pub bind_groups: AtomicU64,
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
    /// bindings, counting it and its bind group in `recorded` (an empty grid records neither).
    pub fn dispatch(
        &mut self,
        gpu: &Gpu,
        recorded: &Recorded,
        pipeline: &wgpu::ComputePipeline,
        params: &[u32],
        buffers: &[(u32, &WgpuBuffer)],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let mut offset = self.params.len().next_multiple_of(self.align_words);
        if ((offset + params.len()) * 4) as u64 > ARENA_BYTES {
            self.flush(gpu);
            offset = 0;
        }
        self.params.resize(offset, 0);
        self.params.extend_from_slice(params);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.arena,
                offset: (offset * 4) as u64,
                size: NonZeroU64::new((params.len().max(1) * 4) as u64),
            }),
        }];
        entries.extend(buffers.iter().map(|(binding, b)| wgpu::BindGroupEntry {
            binding: *binding,
            resource: b.raw().as_entire_binding(),
        }));
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        recorded.bind_groups.fetch_add(1, Ordering::Relaxed);
        if self.pass.is_none() {
            let pass = self
                .encoder(gpu)
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            self.pass = Some(pass);
        }
        let pass = self.pass.as_mut().expect("opened above");
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
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

    /// Submits everything recorded so far.
    pub fn flush(&mut self, gpu: &Gpu) {
        if self.commands == 0 {
            return;
        }
        self.submit(gpu, false);
    }

    /// Submits everything recorded so far with the busy timer's results, and returns the GPU
    /// time of the submissions since the last sync once they complete (call after waiting).
    pub fn flush_for_sync(&mut self, gpu: &Gpu) -> bool {
        let timed = self.timer.as_ref().is_some_and(|t| t.has_work()) || self.commands > 0;
        if timed {
            self.submit(gpu, true);
        }
        timed
    }

    /// The busy time recorded up to the last `flush_for_sync`, once its work has completed.
    pub fn read_busy_ns(&mut self, gpu: &Gpu) -> Option<f64> {
        self.timer.as_mut()?.read(gpu)
    }

    fn submit(&mut self, gpu: &Gpu, resolve_timer: bool) {
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
        // write_buffer lands before this submission's commands and after every earlier one.
        gpu.queue
            .write_buffer(&self.arena, 0, bytemuck::cast_slice(&self.params));
        gpu.queue.submit([encoder.finish()]);
        self.params.clear();
        self.commands = 0;
        self.id += 1;
    }
}
