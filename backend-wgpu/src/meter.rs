//! How busy the device is: each submission is bracketed by two GPU timestamps (where the adapter
//! has TIMESTAMP_QUERY inside encoders), the pairs are resolved and read at the next sync point,
//! and busy time over wall time since the last report is the utilization. Adapters without
//! timestamps report `None` ("unknown"), never a made-up number.

use std::sync::Mutex;
use std::time::Instant;

use lockstep_core::Result;

use crate::gpu::Gpu;

/// Submissions timed between two sync points (later ones go untimed until the next sync).
const PAIRS: u32 = 256;

pub struct Timer {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    pairs: u32,
    running: bool,
    period_ns: f64,
}

impl Timer {
    pub fn new(gpu: &Gpu) -> Option<Timer> {
        let needed = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if !gpu.features.contains(needed) {
            return None;
        }
        let bytes = (PAIRS * 2) as u64 * 8;
        Some(Timer {
            queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("lockstep busy timer"),
                ty: wgpu::QueryType::Timestamp,
                count: PAIRS * 2,
            }),
            resolve: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            pairs: 0,
            running: false,
            period_ns: gpu.queue.get_timestamp_period() as f64,
        })
    }

    /// Called on a fresh encoder, before any command.
    pub fn start(&mut self, encoder: &mut wgpu::CommandEncoder) {
        if self.pairs < PAIRS {
            encoder.write_timestamp(&self.queries, 2 * self.pairs);
            self.running = true;
        }
    }

    /// Whether timed submissions await `resolve`.
    pub fn has_work(&self) -> bool {
        self.pairs > 0 || self.running
    }

    /// Called on the encoder about to be submitted, after its last command.
    pub fn stop(&mut self, encoder: &mut wgpu::CommandEncoder) {
        if self.running {
            encoder.write_timestamp(&self.queries, 2 * self.pairs + 1);
            self.pairs += 1;
            self.running = false;
        }
    }

    /// Records copying the finished pairs where `read` finds them; true when there are any.
    pub fn resolve(&mut self, encoder: &mut wgpu::CommandEncoder) -> bool {
        if self.pairs == 0 {
            return false;
        }
        encoder.resolve_query_set(&self.queries, 0..2 * self.pairs, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, self.pairs as u64 * 16);
        true
    }

    /// The GPU time of the resolved pairs, in ns, once their submission has completed.
    pub fn read(&mut self, gpu: &Gpu) -> Option<f64> {
        let bytes = self.pairs as u64 * 16;
        self.pairs = 0;
        if bytes == 0 {
            return None;
        }
        let ticks = read_ticks(gpu, &self.readback, bytes, |ticks| {
            ticks.chunks_exact(2).map(|p| p[1].saturating_sub(p[0])).sum::<u64>()
        });
        Some(ticks.ok()? as f64 * self.period_ns)
    }
}

/// `f` of the first `bytes` of `readback` as timestamps, once the work writing them completed.
pub fn read_ticks<R>(gpu: &Gpu, readback: &wgpu::Buffer, bytes: u64, f: impl FnOnce(&[u64]) -> R) -> Result<R> {
    let slice = readback.slice(..bytes);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    // Through `Gpu::wait`: a bare poll of a lost device panics.
    gpu.wait()?;
    let result = {
        let view = slice
            .get_mapped_range()
            .map_err(|e| gpu.error(format!("reading timestamps back: {e}")))?;
        f(bytemuck::cast_slice(&view))
    };
    readback.unmap();
    Ok(result)
}

/// Busy time accumulated since the last `utilization` report.
pub struct Meter {
    timed: bool,
    window: Mutex<(f64, Instant)>,
}

impl Meter {
    pub fn new(timed: bool) -> Meter {
        Meter {
            timed,
            window: Mutex::new((0.0, Instant::now())),
        }
    }

    pub fn add_busy_ns(&self, ns: f64) {
        self.window.lock().unwrap_or_else(|p| p.into_inner()).0 += ns;
    }

    /// Busy fraction since the previous call (None without timestamps).
    pub fn utilization(&self) -> Option<f64> {
        if !self.timed {
            return None;
        }
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let wall = w.1.elapsed().as_nanos() as f64;
        let fraction = if wall > 0.0 { (w.0 / wall).clamp(0.0, 1.0) } else { 0.0 };
        *w = (0.0, Instant::now());
        Some(fraction)
    }
}
