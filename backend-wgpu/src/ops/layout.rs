//! zeros/full (fill.wgsl), copy_strided, cast and rand.

use std::sync::Arc;

use lockstep_core::backend::{BufferRef, Distribution};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, HostVec, Result};

use super::strided_params;
use crate::backend::{WgpuBackend, to_u32};
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

impl WgpuBackend {
    pub(crate) fn fill(&self, dtype: DType, len: usize, value: f64) -> Result<BufferRef> {
        if dtype != DType::BF16 {
            self.word_type("full", dtype)?;
        }
        // The value in the dtype's own bits, repeated to fill two words.
        let bytes: Vec<u8> = match HostVec::from_f64(dtype, &[value, value, value, value]) {
            HostVec::F32(v) => bytemuck::cast_slice(&v[..2]).to_vec(),
            HostVec::U32(v) => bytemuck::cast_slice(&v[..2]).to_vec(),
            HostVec::I64(v) => bytemuck::cast_slice(&v[..1]).to_vec(),
            HostVec::F16(v) => bytemuck::cast_slice(&v[..4]).to_vec(),
            HostVec::BF16(v) => bytemuck::cast_slice(&v[..4]).to_vec(),
            other => return Err(Error::dtype("full", other.dtype())),
        };
        let pattern: &[u32] = bytemuck::cast_slice(&bytes);
        let out = self.alloc("full", dtype, len)?;
        let words = (len * dtype.size_in_bytes()).div_ceil(4);
        self.launch(
            &Variant::new("fill", "fill", &[]),
            &[to_u32("full", words)?, pattern[0], pattern[1]],
            &[(1, &out)],
            self.grid("full", words)?,
        )?;
        Ok(out)
    }

    pub(crate) fn copy_between(
        &self,
        src: &WgpuBuffer,
        src_layout: &Layout,
        dst: &WgpuBuffer,
        dst_layout: &Layout,
    ) -> Result<()> {
        const OP: &str = "copy_strided";
        if src_layout.shape != dst_layout.shape {
            return Err(Error::shape(
                OP,
                &src_layout.shape,
                &dst_layout.shape,
                "source and destination views differ",
            ));
        }
        if src.dtype() != dst.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: src.dtype(),
                rhs: dst.dtype(),
            });
        }
        if std::ptr::eq(src, dst) {
            // One binding cannot be read and written in a dispatch: go through a copy.
            let tmp = self.contiguous(src, src_layout)?;
            return self.copy_between(&tmp, &Layout::contiguous(src_layout.shape.clone()), dst, dst_layout);
        }
        if src.dtype() == DType::BF16 {
            return self.copy_bf16(src, src_layout, dst, dst_layout);
        }
        let word = self.word_type(OP, src.dtype())?;
        self.launch(
            &Variant::new(OP, OP, &[word]),
            &strided_params(OP, &[src_layout, dst_layout])?,
            &[(1, src), (2, dst)],
            self.grid(OP, src_layout.elem_count())?,
        )
    }

    /// `cast` for every dtype pair: bf16 through an f32 copy on the way in or out.
    pub(crate) fn cast_any(&self, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
        const OP: &str = "cast";
        let s = self.operand(OP, src, Some(layout))?;
        // Autocast's common case, a whole contiguous tensor, skips the layout copy.
        let whole = layout.is_contiguous() && layout.offset == 0 && layout.elem_count() == s.len();
        match (s.dtype(), dtype) {
            (DType::BF16, DType::F32) if whole => Ok(self.widen_bf16(s)?),
            (DType::F32, DType::BF16) if whole => Ok(self.narrow_bf16(s)?),
            (DType::BF16, DType::BF16) => Ok(self.contiguous(s, layout)?),
            (DType::BF16, to) => {
                let wide = self.convert(&*self.widen_bf16(s)?, layout, DType::F32)?;
                match to {
                    DType::BF16 => Ok(self.narrow_bf16(&wide)?),
                    to => Ok(self.convert(&wide, &Layout::contiguous(layout.shape.clone()), to)?),
                }
            }
            (_, DType::BF16) => Ok(self.narrow_bf16(&*self.convert(s, layout, DType::F32)?)?),
            _ => Ok(self.convert(s, layout, dtype)?),
        }
    }

    pub(crate) fn convert(&self, src: &WgpuBuffer, layout: &Layout, dtype: DType) -> Result<Arc<WgpuBuffer>> {
        const OP: &str = "cast";
        if src.dtype() == dtype {
            return self.contiguous(src, layout);
        }
        let out = self.alloc("convert", dtype, layout.elem_count())?;
        let mut params = strided_params(OP, &[layout])?;
        let grid = self.grid(OP, layout.elem_count())?;
        let (variant, bindings) = match (src.dtype(), dtype) {
            (DType::I64, d) => {
                let t = self.value_type(OP, d)?;
                (Variant::new(OP, "cast_from_i64", &[t, t]), [(3, src), (2, &*out)])
            }
            (s, DType::I64) => {
                let t = self.value_type(OP, s)?;
                params.push(u32::from(s == DType::U32));
                (Variant::new(OP, "cast_to_i64", &[t, t]), [(1, src), (4, &*out)])
            }
            (s, d) => (
                Variant::new(OP, "cast_strided", &[self.value_type(OP, s)?, self.value_type(OP, d)?]),
                [(1, src), (2, &*out)],
            ),
        };
        self.launch(&variant, &params, &bindings, grid)?;
        Ok(out)
    }

    pub(crate) fn random(
        &self,
        dtype: DType,
        len: usize,
        dist: Distribution,
        seed: u64,
        counter: u64,
    ) -> Result<BufferRef> {
        if dtype == DType::BF16 {
            let wide = self.random(DType::F32, len, dist, seed, counter)?;
            return Ok(self.narrow_bf16(crate::buffer::wgpu_buffer("rand", &wide)?)?);
        }
        let t = self.float_type("rand", dtype)?;
        let out = self.alloc("rand", dtype, len)?;
        let (normal, a, b) = match dist {
            Distribution::Uniform { low, high } => (0, low, high - low),
            Distribution::Normal { mean, std } => (1, mean, std),
        };
        let params = [
            to_u32("rand", len)?,
            seed as u32,
            (seed >> 32) as u32,
            counter as u32,
            (counter >> 32) as u32,
            normal,
            (a as f32).to_bits(),
            (b as f32).to_bits(),
        ];
        self.launch(
            &Variant::new("rand", "rand", &[t]),
            &params,
            &[(1, &out)],
            self.grid("rand", len)?,
        )?;
        Ok(out)
    }

    /// Dropout with the stream's mask (rand.wgsl's `dropout` entry), f32 or f16.
    pub(crate) fn dropout_stream(
        &self,
        src: &BufferRef,
        len: usize,
        p: f64,
        seed: u64,
        counter: u64,
    ) -> Result<BufferRef> {
        const OP: &str = "dropout";
        let src = self.operand(OP, src, Some(&Layout::contiguous([len])))?;
        let t = self.float_type(OP, src.dtype())?;
        let out = self.alloc("dropout_stream", src.dtype(), len)?;
        if len == 0 {
            return Ok(out);
        }
        let params = [
            to_u32(OP, len)?,
            seed as u32,
            (seed >> 32) as u32,
            counter as u32,
            (counter >> 32) as u32,
            (p as f32).to_bits(),
            ((1.0 / (1.0 - p)) as f32).to_bits(),
        ];
        self.launch(
            &Variant::new("rand", "dropout", &[t]),
            &params,
            &[(1, &out), (2, src)],
            self.grid(OP, len)?,
        )?;
        Ok(out)
    }
}
