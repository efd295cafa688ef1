//! bf16 without bf16 in WGSL: a bf16 tensor rests in memory as 16-bit halves of u32 words (half
//! the bytes of f32) and each op runs on f32 copies widened just before it, its f32 result
//! rounded back to bf16 (nearest even) just after, by bf16.wgsl. The copies are element for
//! element, so every layout an op is given still applies to them. The ops that dominate a
//! training step skip the f32 copies: the shaders that list bf16 among their types in
//! `lockstep_shaders::SHADERS` (products, unfoldings, elementwise and bias ops, reductions,
//! attention, the loss, batch norm) read and write the packed words themselves
//! (`element_type`), and copies into contiguous views move the 16-bit halves (`copy_bf16`).

use std::sync::Arc;

use lockstep_core::backend::BufferRef;
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use super::strided_params;
use crate::backend::{WgpuBackend, to_u32};
use crate::buffer::{WgpuBuffer, wgpu_buffer};
use crate::pipelines::Variant;

impl WgpuBackend {
    /// An f32 copy of a bf16 buffer (exact).
    pub(crate) fn widen_bf16(&self, src: &WgpuBuffer) -> Result<Arc<WgpuBuffer>> {
        let out = self.alloc("widen_bf16", DType::F32, src.len())?;
        self.launch(
            &Variant::new("bf16", "widen", &[]),
            &[to_u32("bf16", src.len())?],
            &[(1, src), (2, &out)],
            self.grid("bf16", src.len())?,
        )?;
        Ok(out)
    }

    /// Rounds an f32 buffer into `dst`, a bf16 buffer of the same length.
    pub(crate) fn narrow_bf16_into(&self, src: &WgpuBuffer, dst: &WgpuBuffer) -> Result<()> {
        let words = src.len().div_ceil(2);
        self.launch(
            &Variant::new("bf16", "narrow", &[]),
            &[to_u32("bf16", src.len())?, to_u32("bf16", words)?],
            &[(3, src), (4, dst)],
            self.grid("bf16", words)?,
        )
    }

    /// A bf16 copy of an f32 buffer.
    pub(crate) fn narrow_bf16(&self, src: &WgpuBuffer) -> Result<Arc<WgpuBuffer>> {
        let out = self.alloc("narrow_bf16", DType::BF16, src.len())?;
        self.narrow_bf16_into(src, &out)?;
        Ok(out)
    }

    /// Copies the bf16 view `src_layout` of `src` into `dst`'s view `dst_layout`, which must be
    /// contiguous (a strided destination goes through f32 copies: `in_f32_mut`).
    pub(crate) fn copy_bf16(
        &self,
        src: &WgpuBuffer,
        src_layout: &Layout,
        dst: &WgpuBuffer,
        dst_layout: &Layout,
    ) -> Result<()> {
        const OP: &str = "copy_strided";
        if !dst_layout.is_contiguous() {
            return Err(Error::invalid(OP, "a bf16 copy writes a contiguous destination only"));
        }
        let (first, n) = (dst_layout.offset, src_layout.elem_count());
        if n == 0 {
            return Ok(());
        }
        let mut params = strided_params(OP, &[src_layout])?;
        params.push(to_u32(OP, first)?);
        // The destination words from the one holding element `first` to the one holding the last.
        let words = (first + n - 1) / 2 - first / 2 + 1;
        self.launch(
            &Variant::new("bf16", "copy", &[]),
            &params,
            &[(1, src), (4, dst)],
            self.grid(OP, words)?,
        )
    }

    /// Runs `op` on f32 copies of bf16 operands and rounds its f32 result back to bf16. Operands
    /// of other dtypes (indices, masks) pass through; with no bf16 operand `op` runs as it is.
    pub(crate) fn in_f32<const N: usize>(
        &self,
        name: &'static str,
        operands: [&BufferRef; N],
        op: impl FnOnce([&BufferRef; N]) -> Result<BufferRef>,
    ) -> Result<BufferRef> {
        if !involves_bf16(name, &operands)? {
            return op(operands);
        }
        let wide = self.widen_each(name, operands)?;
        let out = op(std::array::from_fn(|i| &wide[i]))?;
        self.rounded(name, out)
    }

    /// As `in_f32` for ops that update `targets` in place: bf16 targets are widened, updated
    /// and rounded back into their own buffers.
    pub(crate) fn in_f32_mut<const T: usize, const N: usize>(
        &self,
        name: &'static str,
        targets: [&BufferRef; T],
        operands: [&BufferRef; N],
        op: impl FnOnce([&BufferRef; T], [&BufferRef; N]) -> Result<()>,
    ) -> Result<()> {
        let all: Vec<&BufferRef> = targets.iter().chain(&operands).copied().collect();
        if !involves_bf16(name, &all)? {
            return op(targets, operands);
        }
        let (t, o) = (self.widen_each(name, targets)?, self.widen_each(name, operands)?);
        op(std::array::from_fn(|i| &t[i]), std::array::from_fn(|i| &o[i]))?;
        for (wide, target) in t.iter().zip(targets) {
            if target.dtype() == DType::BF16 {
                self.narrow_bf16_into(wgpu_buffer(name, wide)?, wgpu_buffer(name, target)?)?;
            }
        }
        Ok(())
    }

    /// f32 copies of the bf16 buffers among `buffers`, the others as they are.
    pub(crate) fn widen_each<const N: usize>(
        &self,
        name: &'static str,
        buffers: [&BufferRef; N],
    ) -> Result<[BufferRef; N]> {
        let mut failed = None;
        let wide = buffers.map(|b| match b.dtype() {
            DType::BF16 => match wgpu_buffer(name, b).and_then(|w| self.widen_bf16(w)) {
                Ok(w) => w as BufferRef,
                Err(e) => {
                    failed.get_or_insert(e);
                    Arc::clone(b)
                }
            },
            _ => Arc::clone(b),
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(wide),
        }
    }

    /// An op's result after running on widened operands: f32 back to bf16, others as they are.
    pub(crate) fn rounded(&self, name: &'static str, out: BufferRef) -> Result<BufferRef> {
        match out.dtype() {
            DType::F32 => Ok(self.narrow_bf16(wgpu_buffer(name, &out)?)?),
            _ => Ok(out),
        }
    }
}

/// Whether any of an op's buffers is bf16; bf16 beside another float dtype is an error, as on
/// every backend.
fn involves_bf16(name: &'static str, buffers: &[&BufferRef]) -> Result<bool> {
    if !buffers.iter().any(|b| b.dtype() == DType::BF16) {
        return Ok(false);
    }
    match buffers
        .iter()
        .find(|b| b.dtype().is_float() && b.dtype() != DType::BF16)
    {
        Some(other) => Err(Error::DTypeMismatch {
            op: name,
            lhs: DType::BF16,
            rhs: other.dtype(),
        }),
        None => Ok(true),
    }
}
