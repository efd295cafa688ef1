//! The CPU's multi-tensor operations: every parameter's update, or every gradient's squares or
//! non-finite elements, cut into chunks that run in parallel together, so a step over many small
//! tensors keeps all threads busy. Each chunk computes what the per-tensor op computes on it, so the results are
//! those of one call per tensor, whatever the thread count.

use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

use rayon::prelude::*;

use super::float::CpuFloat;
use super::optim::{AdamConsts, CHUNK, SgdConsts};
use super::reduce::lane_sum;
use super::stored::Stored;
use super::{CpuBackend, cpu};
use crate::backend::multi_tensor::{check_adam_items, check_factor, check_sgd_items, sum_of_squares_dtype};
use crate::backend::{AdamOperands, BufferRef, SgdOperands};
use crate::dtype::{DType, HostVec};
use crate::error::{Error, Result};

/// Elements per partial sum of `sum_of_squares`: the summation order depends on it alone.
const SUM_CHUNK: usize = 8192;

/// Read locks on `bufs`, each distinct buffer locked once (a gradient two parameters share
/// appears twice), and for each of `bufs` the index of its lock.
fn read_all<'a>(op: &'static str, bufs: &[&'a BufferRef]) -> Result<(Vec<RwLockReadGuard<'a, HostVec>>, Vec<usize>)> {
    let mut distinct: Vec<&BufferRef> = Vec::new();
    let mut index = Vec::with_capacity(bufs.len());
    for b in bufs {
        let at = match distinct.iter().position(|d| Arc::ptr_eq(d, b)) {
            Some(at) => at,
            None => {
                distinct.push(b);
                distinct.len() - 1
            }
        };
        index.push(at);
    }
    let guards = distinct
        .iter()
        .map(|b| Ok(cpu(op, b)?.read()))
        .collect::<Result<Vec<_>>>()?;
    Ok((guards, index))
}

fn write<'a>(op: &'static str, b: &'a BufferRef) -> Result<RwLockWriteGuard<'a, HostVec>> {
    Ok(cpu(op, b)?.write())
}

fn length_error(op: &'static str, what: &str) -> Error {
    Error::invalid(op, format!("{what} must have one length per parameter"))
}

/// One chunk of one parameter's Adam update.
struct AdamJob<'a, T> {
    k: AdamConsts<T>,
    p: &'a mut [T],
    g: &'a [T],
    m: &'a mut [T],
    v: &'a mut [T],
}

/// Cuts one parameter's buffers into `AdamJob`s.
fn adam_jobs<'a, T: CpuFloat>(
    k: AdamConsts<T>,
    (p, g, m, v): (&'a mut [T], &'a [T], &'a mut [T], &'a mut [T]),
    out: &mut Vec<AdamJob<'a, T>>,
) {
    let chunks = p
        .chunks_mut(CHUNK)
        .zip(g.chunks(CHUNK))
        .zip(m.chunks_mut(CHUNK).zip(v.chunks_mut(CHUNK)));
    out.extend(chunks.map(|((p, g), (m, v))| AdamJob { k, p, g, m, v }));
}

pub(super) fn adam_steps(items: &[AdamOperands<'_>]) -> Result<()> {
    const OP: &str = "adam_steps";
    check_adam_items(items)?;
    let grads: Vec<&BufferRef> = items.iter().map(|it| it.grad).collect();
    let (reads, read_at) = read_all(OP, &grads)?;
    let mut writes = items
        .iter()
        .map(|it| Ok([write(OP, it.param)?, write(OP, it.exp_avg)?, write(OP, it.exp_avg_sq)?]))
        .collect::<Result<Vec<_>>>()?;
    let (mut f32_jobs, mut f64_jobs) = (Vec::new(), Vec::new());
    for ((it, [p, m, v]), &g) in items.iter().zip(writes.iter_mut()).zip(&read_at) {
        let n = p.len();
        if reads[g].len() != n || m.len() != n || v.len() != n {
            return Err(length_error(OP, "parameter, gradient and moment buffers"));
        }
        match (&mut **p, &*reads[g], &mut **m, &mut **v) {
            (HostVec::F32(p), HostVec::F32(g), HostVec::F32(m), HostVec::F32(v)) => {
                adam_jobs(AdamConsts::new(&it.step), (p, g, m, v), &mut f32_jobs)
            }
            (HostVec::F64(p), HostVec::F64(g), HostVec::F64(m), HostVec::F64(v)) => {
                adam_jobs(AdamConsts::new(&it.step), (p, g, m, v), &mut f64_jobs)
            }
            (p, ..) => {
                return Err(Error::UnsupportedDType {
                    op: OP,
                    dtype: p.dtype(),
                    hint: "; each parameter's gradient and moments must be f32 (or f64) as it is",
                });
            }
        }
    }
    f32_jobs.into_par_iter().for_each(|j| j.k.apply(j.p, j.g, j.m, j.v));
    f64_jobs.into_par_iter().for_each(|j| j.k.apply(j.p, j.g, j.m, j.v));
    Ok(())
}

/// One chunk of one parameter's SGD update.
struct SgdJob<'a, T> {
    k: SgdConsts<T>,
    p: &'a mut [T],
    g: &'a [T],
    b: Option<&'a mut [T]>,
}

/// Cuts one parameter's buffers into `SgdJob`s.
fn sgd_jobs<'a, T: CpuFloat>(
    k: SgdConsts<T>,
    p: &'a mut [T],
    g: &'a [T],
    b: Option<&'a mut [T]>,
    out: &mut Vec<SgdJob<'a, T>>,
) {
    match b {
        None => out.extend(
            p.chunks_mut(CHUNK)
                .zip(g.chunks(CHUNK))
                .map(|(p, g)| SgdJob { k, p, g, b: None }),
        ),
        Some(b) => out.extend(
            p.chunks_mut(CHUNK)
                .zip(g.chunks(CHUNK))
                .zip(b.chunks_mut(CHUNK))
                .map(|((p, g), b)| SgdJob { k, p, g, b: Some(b) }),
        ),
    }
}

pub(super) fn sgd_steps(items: &[SgdOperands<'_>]) -> Result<()> {
    const OP: &str = "sgd_steps";
    check_sgd_items(items)?;
    let grads: Vec<&BufferRef> = items.iter().map(|it| it.grad).collect();
    let (reads, read_at) = read_all(OP, &grads)?;
    let mut writes = items
        .iter()
        .map(|it| Ok((write(OP, it.param)?, it.momentum_buf.map(|b| write(OP, b)).transpose()?)))
        .collect::<Result<Vec<_>>>()?;
    let (mut f32_jobs, mut f64_jobs) = (Vec::new(), Vec::new());
    for ((it, (p, b)), &g) in items.iter().zip(writes.iter_mut()).zip(&read_at) {
        let n = p.len();
        if reads[g].len() != n || b.as_ref().is_some_and(|b| b.len() != n) {
            return Err(length_error(OP, "parameter, gradient and momentum buffers"));
        }
        match (&mut **p, &*reads[g], b.as_deref_mut()) {
            (HostVec::F32(p), HostVec::F32(g), None) => sgd_jobs(SgdConsts::new(&it.step), p, g, None, &mut f32_jobs),
            (HostVec::F32(p), HostVec::F32(g), Some(HostVec::F32(b))) => {
                sgd_jobs(SgdConsts::new(&it.step), p, g, Some(b), &mut f32_jobs)
            }
            (HostVec::F64(p), HostVec::F64(g), None) => sgd_jobs(SgdConsts::new(&it.step), p, g, None, &mut f64_jobs),
            (HostVec::F64(p), HostVec::F64(g), Some(HostVec::F64(b))) => {
                sgd_jobs(SgdConsts::new(&it.step), p, g, Some(b), &mut f64_jobs)
            }
            (p, ..) => {
                return Err(Error::UnsupportedDType {
                    op: OP,
                    dtype: p.dtype(),
                    hint: "; each parameter's gradient and momentum must be f32 (or f64) as it is",
                });
            }
        }
    }
    f32_jobs.into_par_iter().for_each(|j| j.k.apply(j.p, j.g, j.b));
    f64_jobs.into_par_iter().for_each(|j| j.k.apply(j.p, j.g, j.b));
    Ok(())
}

/// What a chunk of `sum_of_squares` or `non_finite_count` adds up, in f64.
trait ChunkSum {
    fn of<S: Stored<T>, T: CpuFloat>(run: &[S]) -> f64;
}

/// The squares of a chunk, summed in f64 lanes (a fixed order).
struct Squares;

impl ChunkSum for Squares {
    fn of<S: Stored<T>, T: CpuFloat>(run: &[S]) -> f64 {
        lane_sum(run.len(), |i| {
            let x = run[i].load().to_f64();
            x * x
        })
    }
}

/// How many elements of a chunk are inf or NaN (widening keeps both, so `is_finite` on the
/// loaded value judges the stored bits).
struct NonFinite;

impl ChunkSum for NonFinite {
    fn of<S: Stored<T>, T: CpuFloat>(run: &[S]) -> f64 {
        run.iter().filter(|x| !x.load().is_finite()).count() as f64
    }
}

/// The chunk sums of one buffer, appended to `out` as closures over its chunks.
fn chunk_jobs<'a, K: ChunkSum>(
    op: &'static str,
    data: &'a HostVec,
    out: &mut Vec<Box<dyn Fn() -> f64 + Send + Sync + 'a>>,
) -> Result<()> {
    macro_rules! jobs {
        ($v:expr, $t:ty) => {
            out.extend(
                $v.chunks(SUM_CHUNK)
                    .map(|c| Box::new(move || K::of::<_, $t>(c)) as Box<dyn Fn() -> f64 + Send + Sync>),
            )
        };
    }
    match data {
        HostVec::F32(v) => jobs!(v, f32),
        HostVec::F64(v) => jobs!(v, f64),
        HostVec::F16(v) => jobs!(v, f32),
        HostVec::BF16(v) => jobs!(v, f32),
        other => {
            return Err(Error::UnsupportedDType {
                op,
                dtype: other.dtype(),
                hint: "; gradients are floats",
            });
        }
    }
    Ok(())
}

/// Every chunk sum of `bufs` in parallel, added in order: the same total for any number of
/// threads.
fn total_of<K: ChunkSum>(op: &'static str, bufs: &[&BufferRef]) -> Result<f64> {
    let (reads, read_at) = read_all(op, bufs)?;
    let mut jobs = Vec::new();
    for &at in &read_at {
        chunk_jobs::<K>(op, &reads[at], &mut jobs)?;
    }
    let sums: Vec<f64> = jobs.par_iter().map(|job| job()).collect();
    Ok(sums.iter().fold(0.0, |acc, s| acc + s))
}

pub(super) fn sum_of_squares(dev: &CpuBackend, bufs: &[&BufferRef]) -> Result<BufferRef> {
    const OP: &str = "sum_of_squares";
    let total = total_of::<Squares>(OP, bufs)?;
    let data = match sum_of_squares_dtype(bufs) {
        DType::F64 => HostVec::F64(vec![total]),
        _ => HostVec::F32(vec![total as f32]),
    };
    dev.wrap(OP, data)
}

pub(super) fn non_finite_count(dev: &CpuBackend, bufs: &[&BufferRef]) -> Result<BufferRef> {
    const OP: &str = "non_finite_count";
    let total = total_of::<NonFinite>(OP, bufs)?;
    dev.wrap(OP, HostVec::F32(vec![total as f32]))
}

/// `src * factor` rounded once into a new vector of `src`'s type.
fn scaled<S: Stored<T>, T: CpuFloat>(dev: &CpuBackend, src: &[S], factor: f64) -> Vec<S> {
    // The factor as `binary` sees it: converted to the buffer's dtype first.
    let f = S::from_f64(factor).load();
    let mut out = dev.pool.take::<S>(src.len());
    out.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(move |(o, s)| {
            for (o, s) in o.iter_mut().zip(s) {
                *o = S::store(s.load() * f);
            }
        });
    out
}

pub(super) fn scaled_copies(dev: &CpuBackend, bufs: &[&BufferRef], factor: &BufferRef) -> Result<Vec<BufferRef>> {
    const OP: &str = "scaled_copies";
    check_factor(OP, factor)?;
    let f = cpu(OP, factor)?.read().to_f64_vec()[0];
    let (reads, read_at) = read_all(OP, bufs)?;
    read_at
        .iter()
        .map(|&at| {
            let data = match &*reads[at] {
                HostVec::F32(v) => HostVec::F32(scaled::<_, f32>(dev, v, f)),
                HostVec::F64(v) => HostVec::F64(scaled::<_, f64>(dev, v, f)),
                HostVec::F16(v) => HostVec::F16(scaled::<_, f32>(dev, v, f)),
                HostVec::BF16(v) => HostVec::BF16(scaled::<_, f32>(dev, v, f)),
                other => {
                    return Err(Error::UnsupportedDType {
                        op: OP,
                        dtype: other.dtype(),
                        hint: "; gradients are floats",
                    });
                }
            };
            dev.wrap(OP, data)
        })
        .collect()
}
