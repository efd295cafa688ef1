//! reduce (reduce.wgsl): sum, max, min and argmax over any set of axes of a strided tensor. A
//! group of invocations (a workgroup, or a fraction of one for short reductions) per output, or,
//! when the outputs are too few to fill a GPU, per chunk of an output's reduced elements, combined
//! in order by a second pass. Where the kept elements are one contiguous run (column sums), an
//! invocation per column and chunk instead, so neighbours read neighbouring addresses. bf16 is
//! read in its packed words and summed in f32 (a bias gradient's tokens are never copied to f32);
//! only the outputs are rounded afterwards.

use std::sync::Arc;

use lockstep_core::backend::gpu_plan::{chunk_len, column_chunk_len, reduces_by_columns};
use lockstep_core::backend::{BufferRef, ReduceKind, split_axes};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::{WORKGROUP, WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

impl WgpuBackend {
    pub(crate) fn reduce_axes(
        &self,
        kind: ReduceKind,
        src: &BufferRef,
        layout: &Layout,
        axes: &[usize],
    ) -> Result<BufferRef> {
        let op = kind.name();
        let src = self.operand(op, src, Some(layout))?;
        let source_type = self.element_type(op, src.dtype())?;
        // The shader's output dtype: bf16's values are written as f32 and rounded after.
        let written = match src.dtype() {
            DType::BF16 => DType::F32,
            d => d,
        };
        let out_type = self.float_type(op, written)?;
        kind.check_axes(layout.shape.rank(), axes)?;
        // Kept and reduced sub-shapes, each as sizes then strides.
        let words = |v: &[usize]| v.iter().map(|&x| to_u32(op, x)).collect::<Result<Vec<u32>>>();
        let [kept, reduced] = split_axes(layout, axes);
        let columns = reduces_by_columns(&kept.1, kept.0.iter().product());
        let (kept, reduced) = (
            (words(&kept.0)?, words(&kept.1)?),
            (words(&reduced.0)?, words(&reduced.1)?),
        );
        let n_out: usize = layout
            .dims()
            .iter()
            .enumerate()
            .filter(|(a, _)| !axes.contains(a))
            .map(|(_, &d)| d)
            .product();
        let n_red: usize = axes.iter().map(|&a| layout.dims()[a]).product();
        // A column reduction: a thread per column and chunk, unless that needs no chunks (the
        // grouped pass then takes one dispatch) or more workgroups than a grid row holds.
        let column_len = column_chunk_len(n_out, n_red);
        let column_chunks = n_red.div_ceil(column_len);
        let max_groups = self.gpu.limits.max_compute_workgroups_per_dimension as usize;
        let by_columns = columns
            && column_chunks >= 2
            && n_out.div_ceil(WORKGROUP as usize) <= max_groups
            && column_chunks <= max_groups;
        let chunk_len = if by_columns {
            column_len
        } else {
            chunk_len(n_out, n_red)
        };
        let chunks = n_red.div_ceil(chunk_len);
        let (group, workgroups) = if by_columns {
            (
                0,
                [to_u32(op, n_out.div_ceil(WORKGROUP as usize))?, to_u32(op, chunks)?, 1],
            )
        } else {
            self.row_groups(op, n_out * chunks.max(1), chunk_len)?
        };
        let mut params = vec![
            to_u32(op, n_out)?,
            kept.0.len() as u32,
            to_u32(op, n_red)?,
            reduced.0.len() as u32,
            to_u32(op, layout.offset)?,
            to_u32(op, chunk_len)?,
            group,
        ];
        params.extend(kept.0.iter().chain(&kept.1).chain(&reduced.0).chain(&reduced.1));
        let argmax = kind == ReduceKind::ArgMax;
        let (out_dtype, binding) = if argmax { (DType::U32, 3) } else { (written, 2) };
        let kind_index = ReduceKind::ALL.iter().position(|k| *k == kind).expect("in ALL") as f64;
        let variant = |entry| Variant::new("reduce", entry, &[source_type, out_type]).constant("KIND", kind_index);
        let out = self.alloc("reduce", out_dtype, n_out)?;
        // What a bf16 source's f32 values become: bf16 (argmax's indices stay as they are).
        let stored = |out: Arc<WgpuBuffer>| match src.dtype() {
            DType::BF16 => self.rounded(op, out),
            _ => Ok(out as BufferRef),
        };
        if chunks <= 1 {
            let entry = if argmax { "argmax" } else { "reduce" };
            self.launch(&variant(entry), &params, &[(1, src), (binding, &out)], workgroups)?;
            return stored(out);
        }
        let partials = n_out * chunks;
        let (value, index) = (
            self.alloc("reduce", DType::F32, partials)?,
            self.alloc("reduce", DType::U32, partials)?,
        );
        let first_pass = if by_columns {
            "reduce_column_chunks"
        } else {
            "reduce_chunks"
        };
        self.launch(
            &variant(first_pass),
            &params,
            &[(1, src), (4, &value), (5, &index)],
            workgroups,
        )?;
        let entry = if argmax {
            "combine_chunks_argmax"
        } else {
            "combine_chunks"
        };
        let (group, workgroups) = self.row_groups(op, n_out, chunks)?;
        self.launch(
            &variant(entry),
            &[to_u32(op, n_out)?, to_u32(op, chunks)?, group],
            &[(4, &value), (5, &index), (binding, &out)],
            workgroups,
        )?;
        stored(out)
    }
}
