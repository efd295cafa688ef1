//! index_add / scatter_add walk each destination's own sources instead of scanning every source
//! for every destination element (about 3e11 loop iterations for a GPT-2 embedding's backward,
//! which looked hung), reductions with few outputs split each output over many workgroups, and
//! short reductions share a workgroup between outputs. All keep their results: the adds sum in source order (bit for bit the CPU's in f32), the
//! extrema keep the first index and the NaN rules.

mod support;

use std::time::Instant;

use lockstep_core::{DType, Device, Tensor};

/// Deterministic pseudo-random u32s (a 64-bit LCG's high words).
fn lcg(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        })
        .collect()
}

/// Values in [-1, 1) with all their mantissa bits in use, so any change of summation order shows.
fn values(seed: u64, n: usize) -> Vec<f32> {
    lcg(seed, n)
        .iter()
        .map(|&u| (u as f32 / (1u32 << 31) as f32) * 2.0 - 1.0)
        .collect()
}

fn tensor<T: lockstep_core::Element>(data: &[T], device: &Device) -> Tensor {
    Tensor::from_slice(data, [data.len()], device).unwrap()
}

/// The geometry of one in-place add: dst [outer, dst_dim, inner], src [outer, src_dim, inner].
#[derive(Clone, Copy, Debug)]
struct AddAt {
    per_element: bool,
    outer: usize,
    dst_dim: usize,
    src_dim: usize,
    inner: usize,
}

impl AddAt {
    /// `dst` after the add on `device` (index_add, or scatter_add when `per_element`).
    fn run(self, device: &Device, dst: &[f32], src: &[f32], ids: &[u32]) -> Vec<f32> {
        let (d, s, i) = (tensor(dst, device), tensor(src, device), tensor(ids, device));
        let b = device.backend();
        let (outer, src_dim, inner) = (self.outer, self.src_dim, self.inner);
        if self.per_element {
            b.scatter_add(d.buffer(), self.dst_dim, s.buffer(), outer, src_dim, inner, i.buffer())
        } else {
            b.index_add(d.buffer(), self.dst_dim, s.buffer(), outer, src_dim, inner, i.buffer())
        }
        .unwrap();
        d.to_vec::<f32>().unwrap()
    }

    /// The adds on the host, in source order; ids outside the destination add nothing.
    fn expected(self, dst: &[f32], src: &[f32], ids: &[u32]) -> Vec<f32> {
        let mut out = dst.to_vec();
        for o in 0..self.outer {
            for j in 0..self.src_dim {
                for i in 0..self.inner {
                    let s = (o * self.src_dim + j) * self.inner + i;
                    let id = ids[if self.per_element { s } else { j }] as usize;
                    if id < self.dst_dim {
                        out[(o * self.dst_dim + id) * self.inner + i] += src[s];
                    }
                }
            }
        }
        out
    }

    fn check(self, device: &Device, ids: &[u32], seed: u64) {
        let dst = values(seed, self.outer * self.dst_dim * self.inner);
        let src = values(seed + 1, self.outer * self.src_dim * self.inner);
        let got = self.run(device, &dst, &src, ids);
        let in_range = ids.iter().all(|&i| (i as usize) < self.dst_dim);
        let expected = if in_range {
            self.run(&Device::cpu(), &dst, &src, ids)
        } else {
            // The CPU refuses out-of-range ids; GPUs add nothing for them (no error without a sync).
            self.expected(&dst, &src, ids)
        };
        assert_eq!(got.len(), expected.len());
        for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.to_bits(), e.to_bits(), "{self:?}: element {k}: {g} against {e}");
        }
    }
}

#[test]
fn index_add_and_scatter_add_sum_repeated_ids_in_source_order_like_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    // Many sources per destination row (13 distinct ids over 300 rows), a few rows never hit.
    let index_add = AddAt {
        per_element: false,
        outer: 3,
        dst_dim: 17,
        src_dim: 300,
        inner: 5,
    };
    let ids: Vec<u32> = (0..300).map(|j| (j * 7 % 13) as u32).collect();
    index_add.check(&device, &ids, 1);
    // Two sources: few enough that the backend may scan them all for each destination.
    let short = AddAt {
        src_dim: 2,
        ..index_add
    };
    short.check(&device, &[4, 4], 2);
    // An embedding's backward: a wide destination, ids drawn from it with repeats.
    let embedding = AddAt {
        per_element: false,
        outer: 1,
        dst_dim: 5000,
        src_dim: 700,
        inner: 3,
    };
    let ids: Vec<u32> = lcg(3, 700).iter().map(|&u| u % 400).collect();
    embedding.check(&device, &ids, 4);

    // scatter_add: one id per element, each (outer, inner) column summing on its own.
    let scatter_add = AddAt {
        per_element: true,
        outer: 2,
        dst_dim: 300,
        src_dim: 250,
        inner: 3,
    };
    let ids: Vec<u32> = lcg(5, 2 * 250 * 3).iter().map(|&u| u % 20).collect();
    scatter_add.check(&device, &ids, 6);
    // A cross-entropy's gather backward: one source per row, a wide destination.
    let one_per_row = AddAt {
        per_element: true,
        outer: 64,
        dst_dim: 1000,
        src_dim: 1,
        inner: 1,
    };
    let ids: Vec<u32> = lcg(7, 64).iter().map(|&u| u % 1000).collect();
    one_per_row.check(&device, &ids, 8);
}

#[test]
fn ids_outside_the_destination_add_nothing() {
    let Some(device) = support::wgpu_device() else { return };
    for per_element in [false, true] {
        for (dst_dim, src_dim) in [(40, 200), (500, 300), (40, 2)] {
            let add = AddAt {
                per_element,
                outer: 2,
                dst_dim,
                src_dim,
                inner: 3,
            };
            let n_ids = if per_element { 2 * src_dim * 3 } else { src_dim };
            // Every third id is past the end (u32::MAX is how a negative label arrives).
            let ids: Vec<u32> = lcg(9, n_ids)
                .iter()
                .enumerate()
                .map(|(k, &u)| match k % 6 {
                    0 => dst_dim as u32,
                    3 => u32::MAX,
                    _ => u % 11,
                })
                .collect();
            add.check(&device, &ids, 10);
        }
    }
}

#[test]
fn an_embedding_backward_costs_a_few_elementwise_ops() {
    let Some(device) = support::wgpu_device() else { return };
    // 50k rows of 8 (a vocabulary's embedding, narrowed) and 1024 tokens: 4e8 iterations when
    // every destination element scans every token.
    let (rows, width, tokens) = (50_000, 8, 1024);
    let dst = Tensor::zeros([rows, width], DType::F32, &device).unwrap();
    let src = Tensor::from_vec(values(11, tokens * width), [tokens, width], &device).unwrap();
    let ids: Vec<u32> = lcg(12, tokens).iter().map(|&u| u % rows as u32).collect();
    let ids = tensor(&ids, &device);
    let b = device.backend();
    let index_add = support::median_seconds(&device, 3, &|| {
        b.index_add(dst.buffer(), rows, src.buffer(), 1, tokens, width, ids.buffer())
            .unwrap()
    });
    let elementwise = support::median_seconds(&device, 3, &|| drop(dst.affine(2.0, 1.0).unwrap()));
    eprintln!(
        "index_add of {tokens}x{width} into {rows}x{width} on this adapter: {index_add:.4} s, \
         an elementwise op over the destination {elementwise:.4} s"
    );
    // Here (2 cores): 24 ms against a 6.4 ms elementwise op; scanning every token took 0.51 s.
    assert!(
        index_add < 15.0 * elementwise.max(1e-3),
        "index_add took {index_add:.4} s, an elementwise op of its destination {elementwise:.4} s"
    );
}

#[test]
fn few_output_reductions_match_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    let cpu = Device::cpu();
    let n = 3 << 20;
    let data = values(13, n);
    let on = |d: &Device| Tensor::from_slice(&data, [n], d).unwrap();
    let (x, x_cpu) = (on(&device), on(&cpu));

    let start = Instant::now();
    let sum = x.sum_all().unwrap().to_vec::<f32>().unwrap()[0];
    eprintln!("sum_all of {n} on this adapter: {:.4} s", start.elapsed().as_secs_f64());
    let exact: f64 = data.iter().map(|&v| v as f64).sum();
    let cpu_sum = x_cpu.sum_all().unwrap().to_vec::<f32>().unwrap()[0];
    let scale: f64 = data.iter().map(|&v| v.abs() as f64).sum();
    for (who, s) in [("wgpu", sum), ("cpu", cpu_sum)] {
        assert!((s as f64 - exact).abs() <= 1e-6 * scale, "{who}: {s} against {exact}");
    }

    // One long row; the maximum (and minimum) appears twice, far apart: the first must win.
    let mut row = data.clone();
    row[1_000_003] = 7.0;
    row[2_500_000] = 7.0;
    row[123_457] = -7.0;
    row[3_000_000] = -7.0;
    let rows = |d: &Device| Tensor::from_slice(&row, [1, n], d).unwrap();
    let (r, r_cpu) = (rows(&device), rows(&cpu));
    let extrema = |t: &Tensor| {
        (
            t.max(1, false).unwrap().to_vec::<f32>().unwrap(),
            t.min(1, false).unwrap().to_vec::<f32>().unwrap(),
            t.argmax(1, false).unwrap().to_vec::<u32>().unwrap(),
        )
    };
    let got = extrema(&r);
    assert_eq!(got, extrema(&r_cpu));
    assert_eq!(got, (vec![7.0], vec![-7.0], vec![1_000_003]));

    // NaN beats every number and the first NaN wins, across chunks too.
    let mut nans = row.clone();
    nans[2_900_000] = f32::NAN;
    nans[1_500_000] = f32::NAN;
    let t = Tensor::from_slice(&nans, [1, n], &device).unwrap();
    assert!(t.max(1, false).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert!(t.min(1, false).unwrap().to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(t.argmax(1, false).unwrap().to_vec::<u32>().unwrap(), vec![1_500_000]);

    // A few outputs over strided rows: sums of [n/3, 3] down its columns.
    let cols = |d: &Device| Tensor::from_slice(&data, [n / 3, 3], d).unwrap().t().unwrap();
    let (c, c_cpu) = (cols(&device), cols(&cpu));
    let got = c.sum(&[1], false).unwrap().to_vec::<f32>().unwrap();
    let expected = c_cpu.sum(&[1], false).unwrap().to_vec::<f32>().unwrap();
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-6 * scale as f32, "{got:?} against {expected:?}");
    }
    let argmax = |t: &Tensor| t.argmax(1, false).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(argmax(&c), argmax(&c_cpu));
}

#[test]
fn short_reductions_share_a_workgroup_and_match_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    let cpu = Device::cpu();
    // Row lengths for groups of 1, 2, 16, 32 and 256 invocations, over row counts that leave the
    // last workgroup partly empty.
    for (rows, len) in [(37, 1), (37, 10), (300, 33), (45, 300), (19, 1000), (5, 9000)] {
        let mut data = values(20 + len as u64, rows * len);
        for r in 0..rows {
            let row = &mut data[r * len..(r + 1) * len];
            // A tie for the maximum (the first must win) and, in every third row, a NaN after it.
            row[len / 3] = 5.0;
            row[len - 1] = 5.0;
            if r % 3 == 0 {
                row[(len / 2).max(len / 3)] = f32::NAN;
            }
        }
        // Sums of the same rows without their NaNs.
        let finite: Vec<f32> = data.iter().map(|&v| if v.is_nan() { 0.0 } else { v }).collect();
        let on = |values: &[f32], d: &Device| Tensor::from_slice(values, [rows, len], d).unwrap();
        let (x, x_cpu) = (on(&data, &device), on(&data, &cpu));
        let (f, f_cpu) = (on(&finite, &device), on(&finite, &cpu));
        // Along the rows, and down the columns of the transposed view (a strided reduced axis).
        let t = |x: &Tensor| x.t().unwrap();
        for (axis, t, t_cpu, f, f_cpu) in [
            (1, x.clone(), x_cpu.clone(), f.clone(), f_cpu.clone()),
            (0, t(&x), t(&x_cpu), t(&f), t(&f_cpu)),
        ] {
            let label = format!("[{rows}, {len}] reduced along its rows, view axis {axis}");
            // Each row's (max, min) bits and argmax.
            let extrema = |t: &Tensor| {
                let values = |v: Tensor| v.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits);
                let max = values(t.max(axis as isize, false).unwrap());
                let min = values(t.min(axis as isize, false).unwrap());
                let argmax = t.argmax(axis as isize, false).unwrap().to_vec::<u32>().unwrap();
                max.zip(min)
                    .zip(argmax)
                    .map(|((a, b), c)| (a, b, c))
                    .collect::<Vec<_>>()
            };
            let (got, expected) = (extrema(&t), extrema(&t_cpu));
            assert_eq!(got.len(), rows, "{label}");
            if let Some(r) = (0..rows).find(|&r| got[r] != expected[r]) {
                panic!(
                    "{label}: row {r}: (max, min, argmax) {:?} against {:?}",
                    got[r], expected[r]
                );
            }
            let got = f.sum(&[axis as isize], false).unwrap().to_vec::<f32>().unwrap();
            let expected = f_cpu.sum(&[axis as isize], false).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got.len(), rows, "{label}");
            for (r, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-6 * (len as f32 + 10.0),
                    "{label}: row {r}: {g} against {e}"
                );
            }
        }
    }
    // A global average pool's mean over H and W (16 elements an output, two merged axes).
    let pooled = values(30, 6 * 70 * 16);
    let on = |d: &Device| Tensor::from_slice(&pooled, [6, 70, 4, 4], d).unwrap();
    let got = on(&device).mean(&[2, 3], false).unwrap().to_vec::<f32>().unwrap();
    let expected = on(&cpu).mean(&[2, 3], false).unwrap().to_vec::<f32>().unwrap();
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-6, "{g} against {e}");
    }
}
