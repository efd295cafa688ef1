//! Training-mode batch normalisation and its gradient (batch_norm.cu) over a contiguous
//! `[outer, channels, inner]` of f32, f16 or bf16 with f32 weight, bias and statistics: three
//! launches each way, where the composed ops take about twenty and read the input as many times.

use cudarc::driver::LaunchConfig;

use lockstep_core::backend::{BackendBuffer, BatchNormSpec, BufferRef, RunningStatsSpec};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

/// About this many blocks reduce a whole input, whatever its channel count.
const REDUCING_BLOCKS: usize = 1024;
/// Fewer values than this per block are not worth a block of their own.
const MIN_CHUNK: usize = 1024;

/// How each channel's `count` values are cut into `chunks` runs of `len` (the last shorter), one
/// block each. It depends on the shape alone, so every GPU sums in the same order.
struct Chunking {
    count: u32,
    len: u32,
    chunks: u32,
    channels: u32,
    inner: u32,
    elements: u32,
}

impl Chunking {
    fn new(op: &'static str, spec: &BatchNormSpec) -> Result<Chunking> {
        let count = spec.outer * spec.inner;
        let wanted = REDUCING_BLOCKS
            .div_ceil(spec.channels.max(1))
            .min(count.div_ceil(MIN_CHUNK))
            .max(1);
        let len = count.div_ceil(wanted).max(1);
        if spec.channels > u16::MAX as usize {
            return Err(Error::invalid(
                op,
                format!("{} channels: the CUDA kernel takes at most {}", spec.channels, u16::MAX),
            ));
        }
        Ok(Chunking {
            count: to_u32(op, count)?,
            len: to_u32(op, len)?,
            chunks: to_u32(op, count.div_ceil(len).max(1))?,
            channels: to_u32(op, spec.channels)?,
            inner: to_u32(op, spec.inner)?,
            elements: to_u32(op, spec.outer * spec.channels * spec.inner)?,
        })
    }

    /// One block per (chunk, channel).
    fn per_chunk(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.chunks, self.channels, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// One thread per channel.
    fn per_channel(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.channels.div_ceil(BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn parts(&self) -> usize {
        self.chunks as usize * self.channels as usize
    }
}

impl CudaBackend {
    /// `[y, mean, var]` (`y` in the input's dtype), or `None` for dtypes the kernels do not take
    /// (the caller composes those).
    pub(crate) fn batch_norm_fused(
        &self,
        x: &BufferRef,
        [weight, bias]: [&BufferRef; 2],
        spec: &BatchNormSpec,
    ) -> Result<Option<[BufferRef; 3]>> {
        const OP: &str = "batch_norm";
        let Some(([x, weight, bias], dtype)) = self.norm_operands(OP, spec, [x], [weight, bias])? else {
            return Ok(None);
        };
        let at = Chunking::new(OP, spec)?;
        let (part_mean, part_m2) = (
            self.output(DType::F32, at.parts())?,
            self.output(DType::F32, at.parts())?,
        );
        let channels = spec.channels;
        let (mean, var) = (self.output(DType::F32, channels)?, self.output(DType::F32, channels)?);
        let y = self.output(dtype, at.elements as usize)?;
        if at.elements > 0 {
            let eps = spec.eps as f32;
            launch!(&self.gpu, entry_points::BATCH_NORM_MOMENTS.of(OP, dtype)?, at.per_chunk();
                &part_mean.ptr, &part_m2.ptr, &x.ptr, &at.channels, &at.inner, &at.count, &at.len);
            launch!(&self.gpu, entry_points::BATCH_NORM_STATISTICS.entry(), at.per_channel();
                &mean.ptr, &var.ptr, &part_mean.ptr, &part_m2.ptr, &at.channels, &at.count, &at.len, &at.chunks);
            launch!(&self.gpu, entry_points::BATCH_NORM_NORMALIZE.of(OP, dtype)?, self.gpu.grid(at.elements as usize);
                &y.ptr, &x.ptr, &mean.ptr, &var.ptr, &weight.ptr, &bias.ptr, &at.elements, &at.channels,
                &at.inner, &eps);
        }
        Ok(Some([y, mean, var].map(|b| b as BufferRef)))
    }

    /// `[dx, dweight, dbias]` (`dx` in the input's dtype), or `None` as for `batch_norm_fused`.
    pub(crate) fn batch_norm_backward_fused(
        &self,
        [grad, x]: [&BufferRef; 2],
        [weight, mean, var]: [&BufferRef; 3],
        spec: &BatchNormSpec,
    ) -> Result<Option<[BufferRef; 3]>> {
        const OP: &str = "batch_norm_backward";
        let Some(([g, x, weight, mean, var], dtype)) = self.norm_operands(OP, spec, [grad, x], [weight, mean, var])?
        else {
            return Ok(None);
        };
        let at = Chunking::new(OP, spec)?;
        let (part_g, part_gx) = (
            self.output(DType::F32, at.parts())?,
            self.output(DType::F32, at.parts())?,
        );
        let channels = spec.channels;
        let (dweight, dbias) = (self.output(DType::F32, channels)?, self.output(DType::F32, channels)?);
        let dx = self.output(dtype, at.elements as usize)?;
        if at.elements > 0 {
            let (eps, count) = (spec.eps as f32, at.count as f32);
            launch!(&self.gpu, entry_points::BATCH_NORM_GRAD_SUMS.of(OP, dtype)?, at.per_chunk();
                &part_g.ptr, &part_gx.ptr, &g.ptr, &x.ptr, &mean.ptr, &var.ptr, &at.channels, &at.inner,
                &at.count, &at.len, &eps);
            launch!(&self.gpu, entry_points::BATCH_NORM_GRAD_TOTALS.entry(), at.per_channel();
                &dweight.ptr, &dbias.ptr, &part_g.ptr, &part_gx.ptr, &at.channels, &at.chunks);
            launch!(&self.gpu, entry_points::BATCH_NORM_INPUT_GRAD.of(OP, dtype)?, self.gpu.grid(at.elements as usize);
                &dx.ptr, &g.ptr, &x.ptr, &mean.ptr, &var.ptr, &weight.ptr, &dweight.ptr, &dbias.ptr,
                &at.elements, &at.channels, &at.inner, &count, &eps);
        }
        Ok(Some([dx, dweight, dbias].map(|b| b as BufferRef)))
    }

    /// `Backend::batch_norm_running` in one launch; `None` where an operand is not f32 (the
    /// statistics) or I64 (the count): the caller composes those.
    pub(crate) fn batch_norm_running_pass(
        &self,
        running: [&BufferRef; 2],
        batch: [&BufferRef; 2],
        batches: Option<&BufferRef>,
        spec: &RunningStatsSpec,
    ) -> Result<Option<()>> {
        const OP: &str = "batch_norm_running";
        let Some([keep, take, unbias]) = spec.fused_factors(OP, running, batch, batches)? else {
            return Ok(None);
        };
        let [running_mean, running_var, mean, var] =
            [running[0], running[1], batch[0], batch[1]].map(|b| self.operand(OP, b, None));
        let [running_mean, running_var, mean, var] = [running_mean?, running_var?, mean?, var?];
        let batches = batches.map(|b| self.operand(OP, b, None)).transpose()?;
        // No count: a null pointer, which the kernel checks.
        let batches_ptr = batches.map_or(0, |b| b.ptr);
        let n = to_u32(OP, spec.channels)?;
        let per_channel = LaunchConfig {
            grid_dim: (n.div_ceil(BLOCK).max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(&self.gpu, entry_points::BATCH_NORM_RUNNING.entry(), per_channel;
            &running_mean.ptr, &running_var.ptr, &batches_ptr, &mean.ptr, &var.ptr, &n, &keep, &take, &unbias);
        Ok(Some(()))
    }

    /// The whole-input operands, then the per-channel ones, each checked for its extent, and the
    /// whole-input dtype; `None` unless that is f32, f16 or bf16 for all of them and the
    /// per-channel ones are f32.
    fn norm_operands<'a, const E: usize, const C: usize, const N: usize>(
        &self,
        op: &'static str,
        spec: &BatchNormSpec,
        whole: [&'a BufferRef; E],
        per_channel: [&'a BufferRef; C],
    ) -> Result<Option<([&'a CudaBuffer; N], DType)>> {
        let elements = Layout::contiguous([spec.outer * spec.channels * spec.inner]);
        let channels = Layout::contiguous([spec.channels]);
        let whole = whole
            .iter()
            .map(|b| self.operand(op, b, Some(&elements)))
            .collect::<Result<Vec<_>>>()?;
        let per_channel = per_channel
            .iter()
            .map(|b| self.operand(op, b, Some(&channels)))
            .collect::<Result<Vec<_>>>()?;
        let dtype = whole[0].dtype();
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
            || whole.iter().any(|b| b.dtype() != dtype)
            || per_channel.iter().any(|b| b.dtype() != DType::F32)
        {
            return Ok(None);
        }
        let operands: Vec<_> = whole.into_iter().chain(per_channel).collect();
        Ok(operands.try_into().ok().map(|operands| (operands, dtype)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunking(outer: usize, channels: usize, inner: usize) -> Chunking {
        let spec = BatchNormSpec {
            outer,
            channels,
            inner,
            eps: 1e-5,
            channel_major: false,
            relu: false,
        };
        Chunking::new("batch_norm", &spec).unwrap()
    }

    #[test]
    fn chunks_cover_each_channel_and_fill_about_a_thousand_blocks() {
        for (outer, channels, inner) in [(512, 64, 1024), (512, 512, 16), (4, 3, 5), (6, 2, 400), (1, 1, 1)] {
            let at = chunking(outer, channels, inner);
            let count = (outer * inner) as u32;
            assert_eq!(at.count, count);
            // The chunks cover the channel's values, the last one not empty.
            assert!(
                at.chunks * at.len >= count && (at.chunks - 1) * at.len < count,
                "{outer}x{channels}x{inner}"
            );
            assert!(
                at.parts() <= REDUCING_BLOCKS.max(channels),
                "{outer}x{channels}x{inner}"
            );
        }
        // ResNet-18's first layer at batch 512: 16 chunks of 32768 values a channel.
        let at = chunking(512, 64, 1024);
        assert_eq!((at.chunks, at.len), (16, 32768));
        // Small channels stay one block each.
        assert_eq!(chunking(4, 3, 5).chunks, 1);
    }

    #[test]
    fn more_channels_than_a_grid_row_holds_is_an_error_not_a_bad_launch() {
        let spec = BatchNormSpec {
            outer: 1,
            channels: 70_000,
            inner: 1,
            eps: 1e-5,
            channel_major: false,
            relu: false,
        };
        let err = Chunking::new("batch_norm", &spec).err().expect("too many channels");
        assert!(err.to_string().contains("70000 channels"), "{err}");
    }
}
