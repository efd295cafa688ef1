//! Per-kernel device time for `Backend::profile_kernels`: while it is on, every dispatch runs in
//! a compute pass of its own whose beginning and end write timestamps (core TIMESTAMP_QUERY, no
//! timestamps inside passes needed). A submission's pairs are resolved into it, read back as soon
//! as it completes, and added to its pipelines' tallies.

use std::collections::HashMap;

use lockstep_core::Result;
use lockstep_core::backend::KernelTime;

use crate::gpu::Gpu;
use crate::meter::read_ticks;

/// Timed dispatches per submission; the batch submits when they are used up.
const CAPACITY: u32 = 1024;

pub struct KernelTimer {
    /// Whether dispatches are being timed; the tallies outlive it until profiling starts again.
    pub on: bool,
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// The pipeline of each pair written in the submission being recorded.
    pending: Vec<String>,
    /// Per pipeline: launches and nanoseconds.
    tally: HashMap<String, (u64, f64)>,
    period_ns: f64,
}

impl KernelTimer {
    /// None where the adapter has no timestamp queries.
    pub fn new(gpu: &Gpu) -> Option<KernelTimer> {
        if !gpu.features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            return None;
        }
        let bytes = CAPACITY as u64 * 16;
        let buffer = |usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("lockstep kernel timer"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(KernelTimer {
            on: true,
            queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("lockstep kernel timer"),
                ty: wgpu::QueryType::Timestamp,
                count: CAPACITY * 2,
            }),
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            pending: Vec::new(),
            tally: HashMap::new(),
            period_ns: gpu.queue.get_timestamp_period() as f64,
        })
    }

    /// Whether this submission has no pair left for another dispatch.
    pub fn full(&self) -> bool {
        self.pending.len() as u32 >= CAPACITY
    }

    /// The timestamp writes of the pass of the next dispatch, which runs `pipeline`.
    pub fn writes(&mut self, pipeline: &str) -> wgpu::ComputePassTimestampWrites<'_> {
        let pair = self.pending.len() as u32;
        self.pending.push(pipeline.to_string());
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * pair),
            end_of_pass_write_index: Some(2 * pair + 1),
        }
    }

    /// Records copying this submission's pairs to where `read` finds them; true when there are any.
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) -> bool {
        let pairs = self.pending.len() as u32;
        if pairs == 0 {
            return false;
        }
        encoder.resolve_query_set(&self.queries, 0..2 * pairs, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, pairs as u64 * 16);
        true
    }

    /// Adds the resolved pairs to the tallies, once their submission has completed.
    pub fn read(&mut self, gpu: &Gpu) -> Result<()> {
        let bytes = self.pending.len() as u64 * 16;
        if bytes == 0 {
            return Ok(());
        }
        let (pending, tally, period_ns) = (&mut self.pending, &mut self.tally, self.period_ns);
        read_ticks(gpu, &self.readback, bytes, |ticks| {
            for (pipeline, pair) in pending.drain(..).zip(ticks.chunks_exact(2)) {
                let entry = tally.entry(pipeline).or_default();
                entry.0 += 1;
                entry.1 += pair[1].saturating_sub(pair[0]) as f64 * period_ns;
            }
        })
    }

    /// The tallies, longest first.
    pub fn times(&self) -> Vec<KernelTime> {
        let mut times: Vec<KernelTime> = self
            .tally
            .iter()
            .map(|(name, &(launches, ns))| KernelTime {
                name: name.clone(),
                launches,
                seconds: ns * 1e-9,
            })
            .collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
        times
    }
}
