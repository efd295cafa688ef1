//! The multi-tensor kernels of optim.cu (`adam_steps`, `sgd_steps`, `sum_of_squares`,
//! `non_finite_count`, `scaled_copies`, `cast_copies`), as apex's multi_tensor_apply: one launch per dtype for
//! every tensor of a call. The host uploads one table per call (a pinned, stream-ordered copy, no launch): an
//! entry per tensor (its pointers, length and constants) and one per chunk of `CHUNK_LEN`
//! elements, which one block works on. Each item's dtype is grouped; a dtype whose start-up
//! check failed (multi_tensor_check.rs), and f64, take the trait's per-tensor loop.

use cudarc::driver::LaunchConfig;
use lockstep_core::backend::multi_tensor::{
    adam_steps_one_by_one, cast_copies_one_by_one, check_adam_items, check_factor, check_sgd_items,
    non_finite_count_composed, scaled_copies_composed, sgd_steps_one_by_one, sum_of_squares_composed,
};
use lockstep_core::backend::{AdamOperands, Backend, BackendBuffer, BufferRef, SgdOperands};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, HostVec, Result};

use crate::backend::CudaBackend;
use crate::entry_points::{self, Floats};
use crate::gpu::{BLOCK, launch};
use crate::views::to_u32;

/// Elements per block: large enough that a 124M-parameter model is a few thousand blocks, small
/// enough that a block's f32 running sums (128 elements a thread) stay accurate.
pub(crate) const CHUNK_LEN: u32 = 32768;

/// `TensorEntry` of optim.cu: four pointers, a length, ten constants (80 bytes).
const ENTRY_WORDS: usize = 20;

/// One tensor of a multi-tensor launch.
#[derive(Clone, Copy, Default)]
pub(crate) struct Entry {
    pub ptr: [u64; 4],
    pub n: u32,
    pub k: [f32; 10],
}

/// A call's table on the device: the tensors then the chunks, and how many chunks.
struct Table {
    buffer: BufferRef,
    tensors: u64,
    chunks: u64,
    count: u32,
}

impl CudaBackend {
    /// Uploads `entries` and their chunks; `None` when no tensor has an element.
    fn table(&self, entries: &[Entry]) -> Result<Option<Table>> {
        let (words, tensor_words, count) = table_words(entries);
        if count == 0 {
            return Ok(None);
        }
        let count = to_u32("multi-tensor chunks", count)?;
        let buffer = self.upload(&HostVec::U32(words))?;
        let base = self.operand("multi-tensor table", &buffer, None)?.ptr;
        Ok(Some(Table {
            buffer,
            tensors: base,
            chunks: base + 4 * tensor_words as u64,
            count,
        }))
    }

    /// A pointer and the length of `b`, an operand of `op` of `dtype`.
    fn pointer(&self, op: &'static str, b: &BufferRef, dtype: DType, n: usize) -> Result<u64> {
        let buffer = self.operand(op, b, None)?;
        if buffer.dtype() != dtype || buffer.len() != n {
            return Err(Error::invalid(
                op,
                format!(
                    "each parameter's buffers must share its dtype and length: {} of {} against {n} of {dtype}",
                    buffer.len(),
                    buffer.dtype()
                ),
            ));
        }
        Ok(buffer.ptr)
    }

    /// The dtypes among `dtypes` in order of first appearance, each with the indices holding it.
    fn by_dtype(dtypes: impl Iterator<Item = DType>) -> Vec<(DType, Vec<usize>)> {
        let mut groups: Vec<(DType, Vec<usize>)> = Vec::new();
        for (i, d) in dtypes.enumerate() {
            match groups.iter_mut().find(|(g, _)| *g == d) {
                Some((_, list)) => list.push(i),
                None => groups.push((d, vec![i])),
            }
        }
        groups
    }

    /// Whether `dtype` runs the multi-tensor kernels: a CUDA float dtype whose check passed.
    fn fused_for(&self, dtype: DType) -> bool {
        entry_points::float_index("multi-tensor", dtype).is_ok() && self.multi_tensor_passes_check(dtype)
    }

    /// `Backend::adam_steps`.
    pub(crate) fn adam_steps_grouped(&self, items: &[AdamOperands<'_>]) -> Result<()> {
        check_adam_items(items)?;
        for (dtype, at) in Self::by_dtype(items.iter().map(|it| it.param.dtype())) {
            let group: Vec<AdamOperands> = at.iter().map(|&i| items[i]).collect();
            if self.fused_for(dtype) {
                self.adam_steps_fused(dtype, &group)?;
            } else {
                adam_steps_one_by_one(self, &group)?;
            }
        }
        Ok(())
    }

    /// One `adam_steps` launch for `items`, all of `dtype`.
    pub(crate) fn adam_steps_fused(&self, dtype: DType, items: &[AdamOperands<'_>]) -> Result<()> {
        const OP: &str = "adam_steps";
        check_adam_items(items)?;
        let entries = items
            .iter()
            .map(|it| {
                let n = it.param.len();
                let s = &it.step;
                let mut ptr = [0; 4];
                for (p, b) in ptr.iter_mut().zip([it.param, it.grad, it.exp_avg, it.exp_avg_sq]) {
                    *p = self.pointer(OP, b, dtype, n)?;
                }
                // The constants adam_step takes, in its order; the tenth slot stays 0.
                let mut k = [0.0f32; 10];
                for (slot, c) in k.iter_mut().zip(s.constants().in_kernel_order()) {
                    *slot = c as f32;
                }
                Ok(Entry {
                    ptr,
                    n: to_u32(OP, n)?,
                    k,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.launch_updates(OP, entry_points::ADAM_STEPS, dtype, &entries)
    }

    /// `Backend::sgd_steps`.
    pub(crate) fn sgd_steps_grouped(&self, items: &[SgdOperands<'_>]) -> Result<()> {
        check_sgd_items(items)?;
        for (dtype, at) in Self::by_dtype(items.iter().map(|it| it.param.dtype())) {
            let group: Vec<SgdOperands> = at.iter().map(|&i| items[i]).collect();
            if self.fused_for(dtype) {
                self.sgd_steps_fused(dtype, &group)?;
            } else {
                sgd_steps_one_by_one(self, &group)?;
            }
        }
        Ok(())
    }

    /// One `sgd_steps` launch for `items`, all of `dtype`.
    pub(crate) fn sgd_steps_fused(&self, dtype: DType, items: &[SgdOperands<'_>]) -> Result<()> {
        const OP: &str = "sgd_steps";
        let entries = items
            .iter()
            .map(|it| {
                let n = it.param.len();
                let s = &it.step;
                let momentum = it.momentum_buf.map(|b| self.pointer(OP, b, dtype, n)).transpose()?;
                // As `sgd` folds them for sgd_step (ops/optim.rs); a null momentum pointer is none.
                let (keep, take) = if s.first_step {
                    (0.0, 1.0)
                } else {
                    (s.momentum, 1.0 - s.dampening)
                };
                let k = [
                    s.lr,
                    s.weight_decay,
                    keep,
                    take,
                    s.momentum,
                    f64::from(u8::from(s.nesterov)),
                ];
                let mut consts = [0.0; 10];
                consts[..6].copy_from_slice(&k.map(|x| x as f32));
                Ok(Entry {
                    ptr: [
                        self.pointer(OP, it.param, dtype, n)?,
                        self.pointer(OP, it.grad, dtype, n)?,
                        momentum.unwrap_or(0),
                        0,
                    ],
                    n: to_u32(OP, n)?,
                    k: consts,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.launch_updates(OP, entry_points::SGD_STEPS, dtype, &entries)
    }

    /// One launch of the update kernel `kernel` (of `op`) over `entries`.
    fn launch_updates(&self, op: &'static str, kernel: Floats, dtype: DType, entries: &[Entry]) -> Result<()> {
        let entry = kernel.of(op, dtype)?;
        let Some(table) = self.table(entries)? else {
            return Ok(());
        };
        launch!(&self.gpu, entry, chunk_grid(table.count);
            &table.tensors, &table.chunks, &CHUNK_LEN);
        // Freed in stream order: the pool hands it out again only to work queued after this launch.
        drop(table.buffer);
        Ok(())
    }

    /// `Backend::sum_of_squares`: one launch per dtype writing each chunk's sum, one adding them.
    pub(crate) fn sum_of_squares_grouped(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        if bufs.iter().any(|b| !self.fused_for(b.dtype())) {
            return sum_of_squares_composed(self, bufs);
        }
        self.sum_of_squares_fused(bufs)
    }

    /// `sum_of_squares` through the kernels, for CUDA float dtypes.
    pub(crate) fn sum_of_squares_fused(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.chunk_sums("sum_of_squares", entry_points::SUM_OF_SQUARES, bufs)
    }

    /// `Backend::non_finite_count`: one launch per dtype writing each chunk's count, one adding
    /// them.
    pub(crate) fn non_finite_count_grouped(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        if bufs.iter().any(|b| !self.fused_for(b.dtype())) {
            return non_finite_count_composed(self, bufs);
        }
        self.non_finite_count_fused(bufs)
    }

    /// `non_finite_count` through the kernels, for CUDA float dtypes.
    pub(crate) fn non_finite_count_fused(&self, bufs: &[&BufferRef]) -> Result<BufferRef> {
        self.chunk_sums("non_finite_count", entry_points::NON_FINITE_COUNT, bufs)
    }

    /// The total of `kernel`'s per-element term over `bufs` (one f32): per dtype a launch writing
    /// each chunk's sum in f64, then `sum_partials` adding them in a fixed order.
    fn chunk_sums(&self, op: &'static str, kernel: Floats, bufs: &[&BufferRef]) -> Result<BufferRef> {
        let groups = Self::by_dtype(bufs.iter().map(|b| b.dtype()));
        let mut tables = Vec::new();
        for (dtype, at) in &groups {
            let entries = at
                .iter()
                .map(|&i| {
                    let b = self.operand(op, bufs[i], None)?;
                    Ok(Entry {
                        ptr: [b.ptr, 0, 0, 0],
                        n: to_u32(op, b.len())?,
                        ..Entry::default()
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            if let Some(table) = self.table(&entries)? {
                tables.push((*dtype, table));
            }
        }
        let chunks: u32 = tables.iter().map(|(_, t)| t.count).sum();
        if chunks == 0 {
            return self.zeros(DType::F32, 1);
        }
        // Chunk sums in f64, held as 8-byte elements.
        let partials = self.output(DType::I64, chunks as usize)?;
        let mut first = 0u32;
        for (dtype, table) in &tables {
            launch!(&self.gpu, kernel.of(op, *dtype)?, chunk_grid(table.count);
                &table.tensors, &table.chunks, &CHUNK_LEN, &partials.ptr, &first);
            first += table.count;
        }
        let out = self.output(DType::F32, 1)?;
        launch!(&self.gpu, entry_points::SUM_PARTIALS.entry(), chunk_grid(1);
            &partials.ptr, &chunks, &out.ptr);
        Ok(out)
    }

    /// `Backend::scaled_copies`: one launch per dtype writing every copy.
    pub(crate) fn scaled_copies_grouped(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        const OP: &str = "scaled_copies";
        check_factor(OP, factor)?;
        if bufs.iter().any(|b| !self.fused_for(b.dtype())) {
            return scaled_copies_composed(self, bufs, factor);
        }
        self.scaled_copies_fused(bufs, factor)
    }

    /// `scaled_copies` through the kernels, for CUDA float dtypes.
    pub(crate) fn scaled_copies_fused(&self, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
        const OP: &str = "scaled_copies";
        let factor = match factor.dtype() {
            DType::F32 => factor.clone(),
            _ => self.cast(factor, &Layout::contiguous([1]), DType::F32)?,
        };
        let factor_ptr = self.operand(OP, &factor, None)?.ptr;
        let mut outs: Vec<Option<BufferRef>> = vec![None; bufs.len()];
        for (dtype, at) in Self::by_dtype(bufs.iter().map(|b| b.dtype())) {
            let mut entries = Vec::with_capacity(at.len());
            for &i in &at {
                let src = self.operand(OP, bufs[i], None)?;
                let dst = self.output(dtype, src.len())?;
                entries.push(Entry {
                    ptr: [src.ptr, dst.ptr, 0, 0],
                    n: to_u32(OP, src.len())?,
                    ..Entry::default()
                });
                outs[i] = Some(dst as BufferRef);
            }
            if let Some(table) = self.table(&entries)? {
                launch!(&self.gpu, entry_points::SCALED_COPIES.of(OP, dtype)?, chunk_grid(table.count);
                    &table.tensors, &table.chunks, &CHUNK_LEN, &factor_ptr);
            }
        }
        Ok(outs
            .into_iter()
            .map(|o| o.expect("every buffer has a dtype group"))
            .collect())
    }

    /// `Backend::cast_copies`: f32 buffers to f16 or bf16 in one launch, where that dtype's
    /// kernels passed their check; anything else one `cast` each.
    pub(crate) fn cast_copies_grouped(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        let half = matches!(dtype, DType::F16 | DType::BF16);
        if !half || bufs.iter().any(|b| b.dtype() != DType::F32) || !self.fused_for(dtype) {
            return cast_copies_one_by_one(self, bufs, dtype);
        }
        self.cast_copies_fused(bufs, dtype)
    }

    /// `cast_copies` of f32 buffers through the kernel.
    pub(crate) fn cast_copies_fused(&self, bufs: &[&BufferRef], dtype: DType) -> Result<Vec<BufferRef>> {
        const OP: &str = "cast_copies";
        let mut entries = Vec::with_capacity(bufs.len());
        let mut outs = Vec::with_capacity(bufs.len());
        for b in bufs {
            let src = self.operand(OP, b, None)?;
            let dst = self.output(dtype, src.len())?;
            entries.push(Entry {
                ptr: [src.ptr, dst.ptr, 0, 0],
                n: to_u32(OP, src.len())?,
                ..Entry::default()
            });
            outs.push(dst as BufferRef);
        }
        if let Some(table) = self.table(&entries)? {
            launch!(&self.gpu, entry_points::CAST_COPIES.of(OP, dtype)?, chunk_grid(table.count);
                &table.tensors, &table.chunks, &CHUNK_LEN);
        }
        Ok(outs)
    }
}

/// The table of `entries` as optim.cu reads it: a `TensorEntry` per entry, then a `ChunkEntry`
/// (tensor, first element) per `CHUNK_LEN` elements of each; with the number of words before
/// the chunks and the number of chunks.
fn table_words(entries: &[Entry]) -> (Vec<u32>, usize, usize) {
    let mut words = Vec::with_capacity(entries.len() * ENTRY_WORDS);
    let mut chunks = Vec::new();
    for (t, e) in entries.iter().enumerate() {
        for p in e.ptr {
            words.extend([p as u32, (p >> 32) as u32]);
        }
        words.extend([e.n, 0]);
        words.extend(e.k.iter().map(|k| k.to_bits()));
        for start in (0..e.n).step_by(CHUNK_LEN as usize) {
            chunks.extend([t as u32, start]);
        }
    }
    let (tensor_words, count) = (words.len(), chunks.len() / 2);
    words.extend(chunks);
    (words, tensor_words, count)
}

/// One block of `BLOCK` threads per chunk (optim.cu's sums assume 256).
fn chunk_grid(chunks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (chunks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_holds_80_byte_entries_then_one_chunk_per_block_of_elements() {
        let entry = |n: u32, p: u64| Entry {
            ptr: [p, p + 8, 0, 0x1_0000_0004],
            n,
            k: [0.5; 10],
        };
        let entries = [entry(0, 0x7f00_0000_1000), entry(1, 16), entry(2 * CHUNK_LEN + 1, 32)];
        let (words, tensor_words, count) = table_words(&entries);
        assert_eq!(tensor_words, 3 * ENTRY_WORDS, "80 bytes a tensor");
        assert_eq!(
            &words[..4],
            &[0x0000_1000, 0x7f00, 0x0000_1008, 0x7f00],
            "pointers low word first"
        );
        assert_eq!(&words[6..8], &[4, 1], "the fourth pointer");
        assert_eq!(words[8], 0, "the first tensor's length");
        assert_eq!(words[10], 0.5f32.to_bits(), "then the constants");
        assert_eq!(words[ENTRY_WORDS + 8], 1);
        assert_eq!(
            count, 4,
            "none for the empty tensor, one for the single element, three for the long one"
        );
        assert_eq!(
            &words[tensor_words..],
            &[1, 0, 2, 0, 2, CHUNK_LEN, 2, 2 * CHUNK_LEN],
            "(tensor, first element) per chunk"
        );
    }
}
