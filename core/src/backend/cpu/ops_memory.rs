//! The CPU backend's tensors made, copied and converted: filled and random tensors, host
//! copies, strided gathers and casts.

use rayon::prelude::*;

use super::pool::Pool;
use super::{CpuBackend, check_extent, cpu, elementwise, float, strided};
use crate::backend::{BufferRef, Distribution};
use crate::dtype::{DType, Element, HostVec};
use crate::error::{Error, Result};
use crate::map_host_vec;
use crate::shape::Layout;

pub(super) fn full(dev: &CpuBackend, dtype: DType, len: usize, value: f64) -> Result<BufferRef> {
    dev.check_fits("full", dtype, len)?;
    let data = match dtype {
        DType::F32 => typed_full::<f32>(dev, len, value),
        DType::F16 => typed_full::<half::f16>(dev, len, value),
        DType::BF16 => typed_full::<half::bf16>(dev, len, value),
        DType::F64 => typed_full::<f64>(dev, len, value),
        DType::I64 => typed_full::<i64>(dev, len, value),
        DType::U32 => typed_full::<u32>(dev, len, value),
    };
    dev.wrap("full", data)
}

pub(super) fn from_host(dev: &CpuBackend, data: &HostVec) -> Result<BufferRef> {
    let copy = map_host_vec!(data, v => {
        let mut out = dev.pool.take(v.len());
        out.copy_from_slice(v);
        Element::into_host(out)
    });
    dev.wrap("a copy to the device", copy)
}

pub(super) fn to_host(src: &BufferRef, layout: &Layout) -> Result<HostVec> {
    check_extent("to_host", src, layout)?;
    let data = cpu("to_host", src)?.read();
    Ok(map_host_vec!(&*data, v => {
        let mut out = vec![v.first().copied().unwrap_or_else(|| Element::from_f64(0.0)); layout.elem_count()];
        strided::gather(v, layout, &mut out);
        Element::into_host(out)
    }))
}

pub(super) fn rand(
    dev: &CpuBackend,
    dtype: DType,
    len: usize,
    dist: Distribution,
    seed: u64,
    counter: u64,
) -> Result<BufferRef> {
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: "rand",
            dtype,
            hint: "; random tensors are floating point",
        });
    }
    dev.check_fits("rand", dtype, len)?;
    let block = |b: u64| match dist {
        Distribution::Uniform { low, high } => {
            crate::rng::uniform_block(seed, counter, b).map(|u| low + (high - low) * u)
        }
        Distribution::Normal { mean, std } => crate::rng::normal_block(seed, counter, b).map(|n| mean + std * n),
    };
    dev.wrap(
        "rand",
        match dtype {
            DType::F32 => HostVec::F32(random_fill(&dev.pool, len, block)),
            DType::F64 => HostVec::F64(random_fill(&dev.pool, len, block)),
            DType::F16 => HostVec::F16(random_fill(&dev.pool, len, block)),
            DType::BF16 => HostVec::BF16(random_fill(&dev.pool, len, block)),
            other => return Err(Error::dtype("rand", other)),
        },
    )
}

pub(super) fn contiguous(dev: &CpuBackend, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
    check_extent("contiguous", src, layout)?;
    let data = cpu("contiguous", src)?.read();
    // From the pool and gathered into: no zeroing pass over a buffer about to be overwritten.
    dev.wrap(
        "contiguous",
        map_host_vec!(&*data, v => {
            let mut out = dev.pool.take(layout.elem_count());
            strided::gather(v, layout, &mut out);
            Element::into_host(out)
        }),
    )
}

pub(super) fn cast(dev: &CpuBackend, src: &BufferRef, layout: &Layout, dtype: DType) -> Result<BufferRef> {
    check_extent("cast", src, layout)?;
    let data = cpu("cast", src)?.read();
    // Between f32 and the half types (mixed precision casts weights every step): `half`'s
    // SIMD slice conversions, which round exactly as the scalar ones.
    if layout.is_contiguous() {
        let range = layout.offset..layout.offset + layout.elem_count();
        let fast = match (&*data, dtype) {
            (HostVec::F32(v), DType::F16) => Some(HostVec::F16(float::narrow_f16(&dev.pool, &v[range]))),
            (HostVec::F32(v), DType::BF16) => Some(HostVec::BF16(float::narrow_bf16(&dev.pool, &v[range]))),
            (HostVec::F16(v), DType::F32) => Some(HostVec::F32(float::widen_f16(&dev.pool, &v[range]))),
            (HostVec::BF16(v), DType::F32) => Some(HostVec::F32(float::widen_bf16(&dev.pool, &v[range]))),
            _ => None,
        };
        if let Some(out) = fast {
            return dev.wrap("cast", out);
        }
    }
    // Through f64, which holds every value of every dtype here exactly (i64 up to 2^53), so
    // each conversion rounds once, as a direct one would.
    fn convert<S: Element, D: Element>(pool: &Pool, v: &[S], layout: &Layout) -> Vec<D> {
        elementwise::map(pool, v, layout, |x| D::from_f64(x.to_f64()))
    }
    let out = map_host_vec!(&*data, v => match dtype {
        DType::F32 => HostVec::F32(convert(&dev.pool, v, layout)),
        DType::F16 => HostVec::F16(convert(&dev.pool, v, layout)),
        DType::BF16 => HostVec::BF16(convert(&dev.pool, v, layout)),
        DType::F64 => HostVec::F64(convert(&dev.pool, v, layout)),
        DType::I64 => HostVec::I64(convert(&dev.pool, v, layout)),
        DType::U32 => HostVec::U32(convert(&dev.pool, v, layout)),
    });
    dev.wrap("convert", out)
}

fn typed_full<T: Element>(dev: &CpuBackend, len: usize, value: f64) -> HostVec {
    let mut v = dev.pool.take::<T>(len);
    v.fill(T::from_f64(value));
    T::into_host(v)
}

/// `len` random values, four per counter block (`block(b)` gives elements 4b … 4b + 3), filled
/// in parallel chunks into a pooled vector.
fn random_fill<T: Element>(pool: &Pool, len: usize, block: impl Fn(u64) -> [f64; 4] + Sync) -> Vec<T> {
    const CHUNK: usize = 4096; // a multiple of 4: chunks start on block boundaries
    let mut out = pool.take::<T>(len);
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let first = (c * CHUNK / 4) as u64;
        for (b, quad) in chunk.chunks_mut(4).enumerate() {
            let values = block(first + b as u64);
            quad.iter_mut().zip(values).for_each(|(o, v)| *o = T::from_f64(v));
        }
    });
    out
}
