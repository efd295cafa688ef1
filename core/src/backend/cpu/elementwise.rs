//! Unary, binary, comparison and select kernels over strided operands of one shape.

use rayon::prelude::*;

use super::float::CpuFloat;
use super::pool::Pool;
use super::simd::{Kernel, wide};
use super::stored::{Stored, stored2};
use super::strided::{coalesce, runs};
use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::dtype::Element;
use crate::shape::Layout;

/// Below this many elements, splitting work across threads costs more than it saves.
pub const PAR_THRESHOLD: usize = 1 << 17;

/// A computation over a unary op's function, which `with_unary` picks once per call, so each
/// op's loop is compiled on its own (the op is not matched per element).
pub trait WithUnary<T> {
    type Out;
    fn apply<F: Fn(T) -> T + Send + Sync + Copy>(self, f: F) -> Self::Out;
}

/// Runs `task` with the function of `op` in `T`: every unary op's definition on the CPU.
pub fn with_unary<T: CpuFloat, W: WithUnary<T>>(op: UnaryOp, task: W) -> W::Out {
    let one = T::one();
    match op {
        UnaryOp::Neg => task.apply(|x: T| -x),
        UnaryOp::Abs => task.apply(|x: T| x.abs()),
        UnaryOp::Exp => task.apply(|x: T| x.exp()),
        UnaryOp::Log => task.apply(|x: T| x.ln()),
        UnaryOp::Sqrt => task.apply(|x: T| x.sqrt()),
        UnaryOp::Recip => task.apply(|x: T| x.recip()),
        UnaryOp::Tanh => task.apply(|x: T| x.tanh()),
        UnaryOp::Sigmoid => task.apply(move |x: T| one / (one + (-x).exp())),
        UnaryOp::Relu => task.apply(|x: T| max_nan(x, T::zero())),
        UnaryOp::Gelu => task.apply(|x: T| x.gelu()),
        UnaryOp::GeluGrad => task.apply(|x: T| x.gelu_grad()),
        UnaryOp::Powf(e) => {
            let e = T::of(e);
            task.apply(move |x: T| x.powf(e))
        }
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (T::of(mul), T::of(add));
            task.apply(move |x: T| x * m + a)
        }
        UnaryOp::ClampMin(m) => {
            let m = T::of(m);
            task.apply(move |x: T| max_nan(x, m))
        }
        UnaryOp::ClampMax(m) => {
            let m = T::of(m);
            task.apply(move |x: T| min_nan(x, m))
        }
        UnaryOp::NonFinite => task.apply(move |x: T| if x.is_finite() { T::zero() } else { one }),
    }
}

/// Applies a unary op to elements stored as `S`, computing in `T`.
pub fn unary<S: Stored<T>, T: CpuFloat>(pool: &Pool, src: &[S], layout: &Layout, op: UnaryOp) -> Vec<S> {
    struct Map<'a, S> {
        pool: &'a Pool,
        src: &'a [S],
        layout: &'a Layout,
    }
    impl<S: Stored<T>, T: CpuFloat> WithUnary<T> for Map<'_, S> {
        type Out = Vec<S>;
        fn apply<F: Fn(T) -> T + Send + Sync + Copy>(self, f: F) -> Vec<S> {
            map(self.pool, self.src, self.layout, move |x: S| S::store(f(x.load())))
        }
    }
    with_unary(op, Map { pool, src, layout })
}

/// The larger of `a` and `b`, NaN if either is (PyTorch's maximum, relu and clamp; Rust's
/// `max` would drop the NaN and hide a diverged value).
pub(super) fn max_nan<T: CpuFloat>(a: T, b: T) -> T {
    if a.is_nan() || a > b { a } else { b }
}

/// The smaller of `a` and `b`, NaN if either is.
fn min_nan<T: CpuFloat>(a: T, b: T) -> T {
    if a.is_nan() || a < b { a } else { b }
}

/// `g` where `x > 0`, else 0 (NaN in `x` passes nothing, as the comparison fails).
fn relu_grad<T: CpuFloat>(g: T, x: T) -> T {
    if x > T::zero() { g } else { T::zero() }
}

/// Applies a binary op to operands stored as `S` and broadcast to one shape, computing in `T`
/// (one compiled loop per op).
pub fn binary<S: Stored<T>, T: CpuFloat>(
    pool: &Pool,
    a: &[S],
    la: &Layout,
    b: &[S],
    lb: &Layout,
    op: BinaryOp,
) -> Vec<S> {
    match op {
        BinaryOp::Add => zip(pool, a, la, b, lb, stored2(|x: T, y: T| x + y)),
        BinaryOp::Sub => zip(pool, a, la, b, lb, stored2(|x: T, y: T| x - y)),
        BinaryOp::Mul => zip(pool, a, la, b, lb, stored2(|x: T, y: T| x * y)),
        BinaryOp::Div => zip(pool, a, la, b, lb, stored2(|x: T, y: T| x / y)),
        BinaryOp::Pow => zip(pool, a, la, b, lb, stored2(|x: T, y: T| x.powf(y))),
        BinaryOp::Maximum => zip(pool, a, la, b, lb, stored2(max_nan::<T>)),
        BinaryOp::Minimum => zip(pool, a, la, b, lb, stored2(min_nan::<T>)),
        BinaryOp::ReluGrad => zip(pool, a, la, b, lb, stored2(relu_grad::<T>)),
    }
}

/// 1 where the comparison holds, else 0 (one compiled loop per comparison).
pub fn compare<T: Element>(pool: &Pool, a: &[T], la: &Layout, b: &[T], lb: &Layout, op: CmpOp) -> Vec<u32> {
    match op {
        CmpOp::Eq => zip(pool, a, la, b, lb, |x: T, y: T| (x == y) as u32),
        CmpOp::Ne => zip(pool, a, la, b, lb, |x: T, y: T| (x != y) as u32),
        CmpOp::Lt => zip(pool, a, la, b, lb, |x: T, y: T| (x < y) as u32),
        CmpOp::Le => zip(pool, a, la, b, lb, |x: T, y: T| (x <= y) as u32),
        CmpOp::Gt => zip(pool, a, la, b, lb, |x: T, y: T| (x > y) as u32),
        CmpOp::Ge => zip(pool, a, la, b, lb, |x: T, y: T| (x >= y) as u32),
    }
}

/// `out[i] = f(src[layout[i]])`.
/// `f` is taken by value and copied into each chunk's loop: constants it captured then live in
/// registers instead of being reloaded through a pointer per element, which keeps loops scalar.
pub fn map<T: Element, U: Element>(
    pool: &Pool,
    src: &[T],
    layout: &Layout,
    f: impl Fn(T) -> U + Send + Sync + Copy,
) -> Vec<U> {
    let n = layout.elem_count();
    let mut out = pool.take::<U>(n);
    if let Some(range) = layout.contiguous_range() {
        let src = &src[range];
        if n >= PAR_THRESHOLD {
            out.par_chunks_mut(4096)
                .zip(src.par_chunks(4096))
                .for_each(move |(o, s)| wide(MapSlices(o, s, f)));
        } else {
            wide(MapSlices(&mut out[..], src, f));
        }
        return out;
    }
    let l = &coalesce(&[layout])[0];
    let r = runs(l);
    for (row, &start) in out.chunks_mut(r.len.max(1)).zip(&r.starts) {
        for (j, o) in row.iter_mut().enumerate() {
            *o = f(src[start + j * r.stride]);
        }
    }
    out
}

/// `o[i] = f(s[i])`, run by `simd::wide`.
struct MapSlices<'a, T, U, F>(&'a mut [U], &'a [T], F);
impl<T: Copy, U, F: Fn(T) -> U> Kernel for MapSlices<'_, T, U, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let MapSlices(o, s, f) = self;
        for (o, &s) in o.iter_mut().zip(s) {
            *o = f(s);
        }
    }
}

/// `zip_slices`, run by `simd::wide`.
struct ZipSlices<'a, T, U, F>(&'a mut [U], &'a [T], &'a [T], F);
impl<T: Copy, U, F: Fn(T, T) -> U> Kernel for ZipSlices<'_, T, U, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        zip_slices((self.0, self.1, self.2, self.3))
    }
}

/// One run of `zip` over views: `o[j] = f(a[j * sa], b[j * sb])`, with the strides of
/// broadcasting (a per-channel operand against an activation) given loops that vectorise. Run
/// by `simd::wide`.
struct ZipRun<'a, T, U, F> {
    o: &'a mut [U],
    a: &'a [T],
    b: &'a [T],
    strides: (usize, usize),
    f: F,
}
impl<T: Copy, U, F: Fn(T, T) -> U> Kernel for ZipRun<'_, T, U, F> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        let ZipRun { o, a, b, strides, f } = self;
        let len = o.len();
        match strides {
            (1, 1) => zip_slices((o, &a[..len], &b[..len], f)),
            (1, 0) => {
                let (x, y) = (&a[..len], b[0]);
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(x[j], y);
                }
            }
            (0, 1) => {
                let (x, y) = (a[0], &b[..len]);
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(x, y[j]);
                }
            }
            (s, t) => {
                for (j, o) in o.iter_mut().enumerate() {
                    *o = f(a[j * s], b[j * t]);
                }
            }
        }
    }
}

/// `o[i] = f(a[i], b[i])` over equal-length slices, indexed so it vectorises.
#[inline(always)]
fn zip_slices<T: Copy, U>((o, a, b, f): (&mut [U], &[T], &[T], impl Fn(T, T) -> U)) {
    let n = o.len();
    let (a, b) = (&a[..n], &b[..n]);
    for i in 0..n {
        o[i] = f(a[i], b[i]);
    }
}

/// `out[i] = f(a[la[i]], b[lb[i]])` for two layouts of one shape (broadcasts have stride 0).
pub fn zip<T: Element, U: Element>(
    pool: &Pool,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    f: impl Fn(T, T) -> U + Send + Sync + Copy,
) -> Vec<U> {
    let n = la.elem_count();
    let mut out = pool.take::<U>(n);
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        if n >= PAR_THRESHOLD {
            out.par_chunks_mut(4096)
                .zip(a.par_chunks(4096).zip(b.par_chunks(4096)))
                .for_each(move |(o, (a, b))| wide(ZipSlices(o, a, b, f)));
        } else {
            wide(ZipSlices(&mut out[..], a, b, f));
        }
        return out;
    }
    let merged = coalesce(&[la, lb]);
    let (ra, rb) = (runs(&merged[0]), runs(&merged[1]));
    let len = ra.len.max(1);
    let strides = (ra.stride, rb.stride);
    let row = move |(o, (&sa, &sb)): (&mut [U], (&usize, &usize))| {
        wide(ZipRun {
            o,
            a: &a[sa..],
            b: &b[sb..],
            strides,
            f,
        })
    };
    if n >= PAR_THRESHOLD {
        out.par_chunks_mut(len)
            .zip(ra.starts.par_iter().zip(rb.starts.par_iter()))
            .for_each(row);
    } else {
        out.chunks_mut(len)
            .zip(ra.starts.iter().zip(rb.starts.iter()))
            .for_each(row);
    }
    out
}

/// `out[i] = cond[i] != 0 ? t[i] : f[i]` over three layouts of one shape. The fast paths index
/// equal-length slices and read both sides unconditionally, so they compile to vector blends.
pub fn select<T: Element>(
    pool: &Pool,
    cond: &[u32],
    lc: &Layout,
    t: &[T],
    lt: &Layout,
    f: &[T],
    lf: &Layout,
) -> Vec<T> {
    let n = lc.elem_count();
    let mut out = pool.take::<T>(n);
    if let (Some(rc), Some(rt)) = (lc.contiguous_range(), lt.contiguous_range()) {
        let (o, c, x) = (&mut out[..n], &cond[rc][..n], &t[rt][..n]);
        if let Some(rf) = lf.contiguous_range() {
            let y = &f[rf][..n];
            for i in 0..n {
                // Both sides are read unconditionally so the loop compiles to blends.
                let (xi, yi) = (x[i], y[i]);
                o[i] = if c[i] != 0 { xi } else { yi };
            }
            return out;
        }
        if lf.strides.iter().all(|&s| s == 0) {
            // The common `where(mask, x, scalar)`.
            let y = f[lf.offset];
            for i in 0..n {
                let xi = x[i];
                o[i] = if c[i] != 0 { xi } else { y };
            }
            return out;
        }
    }
    select_runs(&mut out, cond, t, f, &coalesce(&[lc, lt, lf]));
    out
}

/// `select` over views (a causal mask broadcast over batch and heads): row by row, each row a
/// run of one stride per operand, rows in parallel when there are many elements.
fn select_runs<T: Element>(out: &mut [T], cond: &[u32], t: &[T], f: &[T], merged: &[Layout]) {
    let (rc, rt, rf) = (runs(&merged[0]), runs(&merged[1]), runs(&merged[2]));
    let len = rc.len.max(1);
    let (sc, st, sf) = (rc.stride, rt.stride, rf.stride);
    let row = move |(o, ((&c0, &t0), &f0)): (&mut [T], ((&usize, &usize), &usize))| {
        for (j, o) in o.iter_mut().enumerate() {
            let (x, y) = (t[t0 + j * st], f[f0 + j * sf]);
            *o = if cond[c0 + j * sc] != 0 { x } else { y };
        }
    };
    if out.len() >= PAR_THRESHOLD {
        let starts = rc.starts.par_iter().zip(&rt.starts).zip(&rf.starts);
        out.par_chunks_mut(len).zip(starts).for_each(row);
    } else {
        let starts = rc.starts.iter().zip(&rt.starts).zip(&rf.starts);
        out.chunks_mut(len).zip(starts).for_each(row);
    }
}
