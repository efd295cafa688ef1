//! A CPU device's buffer, and the checks every operation makes on the buffers it is given.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::float;
use super::pool::Pool;
use crate::backend::{BackendBuffer, BufferRef};
use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};
use crate::shape::Layout;

/// A host allocation owned by one CPU device. The lock makes the in-place operations
/// (optimizer steps, copies into slices) safe against concurrent readers.
#[derive(Debug)]
pub struct CpuBuffer {
    pub(super) data: RwLock<HostVec>,
    pub(super) pool: Arc<Pool>,
}

impl CpuBuffer {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, HostVec> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, HostVec> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl BackendBuffer for CpuBuffer {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn dtype(&self) -> DType {
        self.read().dtype()
    }
    fn len(&self) -> usize {
        self.read().len()
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let data = std::mem::replace(
            self.data.get_mut().unwrap_or_else(|e| e.into_inner()),
            HostVec::U32(Vec::new()),
        );
        self.pool.give(data);
    }
}

pub(super) fn cpu<'a>(op: &'static str, b: &'a BufferRef) -> Result<&'a CpuBuffer> {
    b.as_any()
        .downcast_ref::<CpuBuffer>()
        .ok_or_else(|| Error::invalid(op, "buffer does not belong to a CPU device"))
}

pub(super) fn check_extent(op: &'static str, b: &BufferRef, layout: &Layout) -> Result<()> {
    if layout.extent() > b.len() {
        return Err(Error::invalid(
            op,
            format!("layout {:?} reaches past a buffer of {} elements", layout, b.len()),
        ));
    }
    Ok(())
}

pub(super) fn u32_ids<'a>(op: &'static str, ids: &'a HostVec) -> Result<&'a [u32]> {
    match ids {
        HostVec::U32(v) => Ok(v),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other.dtype(),
            hint: "; indices are u32",
        }),
    }
}

// In-place kernels lock the destination for writing and the sources for reading: the same
// buffer in two roles would deadlock, so it is refused.
pub(super) use crate::backend::distinct_buffers as distinct;

pub(super) fn check_len(op: &'static str, data: &HostVec, expected: usize) -> Result<()> {
    if data.len() != expected {
        return Err(Error::invalid(
            op,
            format!("buffer holds {} elements, the geometry needs {expected}", data.len()),
        ));
    }
    Ok(())
}

/// Runs an in-place kernel on a float destination with a source of the same dtype (f16 and bf16
/// through the f32 kernel, rounding once).
pub(super) fn float_pair_mut(
    pool: &Pool,
    op: &'static str,
    dst: &mut HostVec,
    src: &HostVec,
    f32_kernel: impl FnOnce(&mut [f32], &[f32]) -> Result<()>,
    f64_kernel: impl FnOnce(&mut [f64], &[f64]) -> Result<()>,
) -> Result<()> {
    match (dst, src) {
        (HostVec::F32(d), HostVec::F32(s)) => f32_kernel(d, s),
        (HostVec::F64(d), HostVec::F64(s)) => f64_kernel(d, s),
        // Fix: the backward passes of index_select, gather, max_pool2d and cross_entropy
        // (index_add, scatter_add) run in every float dtype, so half precision must work too.
        (HostVec::F16(d), HostVec::F16(s)) => {
            let mut wide = float::widen_f16(pool, d);
            f32_kernel(&mut wide, &float::widen_f16(pool, s))?;
            d.iter_mut().zip(wide).for_each(|(d, w)| *d = half::f16::from_f32(w));
            Ok(())
        }
        (HostVec::BF16(d), HostVec::BF16(s)) => {
            let mut wide = float::widen_bf16(pool, d);
            f32_kernel(&mut wide, &float::widen_bf16(pool, s))?;
            d.iter_mut().zip(wide).for_each(|(d, w)| *d = half::bf16::from_f32(w));
            Ok(())
        }
        (d, s) if d.dtype() != s.dtype() => Err(Error::DTypeMismatch {
            op,
            lhs: d.dtype(),
            rhs: s.dtype(),
        }),
        (d, _) => Err(Error::UnsupportedDType {
            op,
            dtype: d.dtype(),
            hint: "; in-place accumulation needs a float dtype",
        }),
    }
}
