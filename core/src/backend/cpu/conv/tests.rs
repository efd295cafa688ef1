//! Every path, forced through the planner, against the f64 reference; and the planner's choices.

use half::bf16;

use super::reference::{POSITIONS, SAME_SIZE, STRIDED, UNSTRIDED, WIDE, reference_with};
use super::*;
use crate::backend::cpu::pool::Pool;
use crate::dtype::HostVec;

const fn square(n: usize, c: usize, size: [usize; 2], k: usize, stride: usize, padding: usize) -> Conv2dGeometry {
    Conv2dGeometry {
        n,
        c,
        h: size[0],
        w: size[1],
        kh: k,
        kw: k,
        stride: [stride; 2],
        padding: [padding; 2],
        dilation: [1, 1],
    }
}

/// Geometries (with output channels) that between them let every path run where the CPU has
/// its kernels: stride 1 and 2, with and without padding, 1x1, 3x3 and 7x7, odd sizes, dilation,
/// batches that leave tiles' lanes empty, sums long enough for `positions`, and channels in
/// whole tile loads for `grid` (a block of grid positions across two images and past the end).
const CASES: [(Conv2dGeometry, usize); 15] = [
    (SAME_SIZE, 5),
    (STRIDED, 5),
    (UNSTRIDED, 5),
    (WIDE, 5),
    (square(2, 16, [8, 8], 1, 1, 0), 6),
    (square(3, 6, [7, 7], 1, 2, 0), 4),
    (square(2, 3, [11, 13], 7, 2, 3), 8),
    (square(2, 10, [5, 7], 3, 1, 1), 7),
    // 4x4 images, 30 of them (lanes left empty): `positions`' input gradients (128 channels
    // out), its bf16 product, its f32 product with 128 channels in; 72 images: its weight
    // gradients; 8x8 at stride 2 into 416 channels: its strided input gradient.
    (POSITIONS, 128),
    (Conv2dGeometry { c: 128, ..POSITIONS }, 40),
    (
        Conv2dGeometry {
            n: 72,
            c: 32,
            ..POSITIONS
        },
        8,
    ),
    (square(30, 16, [8, 8], 3, 2, 1), 416),
    // `grid`: 16x16 (the grid's rows of 18 straddle blocks of 32) into a partial strip of 40
    // output channels; 1x1 over 64 channels with its input gradient too; a non-square image
    // with dilation, into 64 channels.
    (square(3, 32, [16, 16], 3, 1, 1), 40),
    (square(2, 64, [9, 9], 1, 1, 0), 32),
    (
        Conv2dGeometry {
            n: 2,
            c: 32,
            h: 17,
            w: 29,
            kh: 3,
            kw: 3,
            stride: [1, 1],
            padding: [1, 2],
            dilation: [1, 2],
        },
        64,
    ),
];

/// `v` in `dtype`.
fn narrow(v: &[f64], dtype: DType) -> HostVec {
    match dtype {
        DType::F64 => HostVec::F64(v.to_vec()),
        DType::F32 => HostVec::F32(v.iter().map(|&x| x as f32).collect()),
        DType::BF16 => HostVec::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
        other => unreachable!("{other:?} is not convolved here"),
    }
}

/// Whether `got` is `want` within what `dtype` allows: exact in f32 and f64 (the values are
/// multiples of 1/8 and their sums exact there), and within half a bf16 ulp (rounded once).
fn close(got: &HostVec, want: &[f64], dtype: DType) -> bool {
    let got = got.to_f64_vec();
    got.len() == want.len()
        && got.iter().zip(want).all(|(&g, &w)| match dtype {
            DType::BF16 => (g - w).abs() <= w.abs() * 2f64.powi(-8) + 1e-6,
            _ => (g - w).abs() <= 1e-9,
        })
}

/// Each of `paths` forced through `force` where the planner takes it (`taken` reads the pass's
/// path off a plan), `check` comparing what that plan computes; those that ran.
fn each_forced<P: Copy + PartialEq>(
    paths: impl IntoIterator<Item = P>,
    force: impl Fn(P) -> Plan,
    taken: impl Fn(&Plan) -> P,
    check: impl Fn(&Plan),
) -> Vec<P> {
    let mut ran = Vec::new();
    for path in paths {
        let plan = force(path);
        if taken(&plan) == path {
            check(&plan);
            ran.push(path);
        }
    }
    ran
}

/// This CPU as the planner sees it, and where it has AMX tiles, the same CPU without them (so
/// the dot-product kernel's paths run there too).
fn this_cpu_each_bf16_kernel() -> Vec<Cpu> {
    let this = Cpu::this();
    let mut cpus = vec![this];
    if this.tiles {
        cpus.push(Cpu { tiles: false, ..this });
    }
    cpus
}

#[test]
fn every_path_forced_through_the_planner_matches_the_f64_reference() {
    for cpu in this_cpu_each_bf16_kernel() {
        every_path_forced_on(&cpu);
    }
}

fn every_path_forced_on(cpu: &Cpu) {
    let pool = Pool::default();
    // (dtype, pass, path) of every forced run.
    let mut ran: Vec<(DType, &str, &str)> = Vec::new();
    for (g, o) in CASES {
        let r = reference_with(&pool, g, o);
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (x, w, grad) = (narrow(&r.x, dtype), narrow(&r.w, dtype), narrow(&r.grad, dtype));
            let planned = |force: Override| plan(&g, o, dtype, cpu, force).expect("a float dtype");
            let forced = |forward, input, weight| planned(Override { forward, input, weight });
            let gradients = |plan: &Plan| backward(&pool, &x, &w, &grad, &g, o, plan).expect("one dtype");
            let forwards = each_forced(
                Forward::ALL,
                |p| forced(Some(p), None, None),
                |p| p.forward,
                |plan| {
                    let out = forward(&pool, &x, &w, &g, o, plan).expect("one dtype");
                    assert!(close(&out, &r.forward, dtype), "forward {g:?} {dtype:?} ({plan})");
                },
            );
            let inputs = each_forced(
                InputGrad::ALL,
                |p| forced(None, Some(p), None),
                |p| p.input,
                |plan| {
                    let (grad_x, _) = gradients(plan);
                    assert!(close(&grad_x, &r.grad_x, dtype), "input grad {g:?} {dtype:?} ({plan})");
                },
            );
            let weights = each_forced(
                WeightGrad::ALL,
                |p| forced(None, None, Some(p)),
                |p| p.weight,
                |plan| {
                    let (_, grad_w) = gradients(plan);
                    assert!(close(&grad_w, &r.grad_w, dtype), "weight grad {g:?} {dtype:?} ({plan})");
                },
            );
            ran.extend(forwards.into_iter().map(|p| (dtype, "forward", p.name())));
            ran.extend(inputs.into_iter().map(|p| (dtype, "input", p.name())));
            ran.extend(weights.into_iter().map(|p| (dtype, "weight", p.name())));
        }
    }
    // Every path this CPU has the kernels for ran somewhere (on tiles, bf16 takes only their
    // paths).
    let (bf16, tiles) = (cpu.bf16 && !cpu.tiles, cpu.tiles);
    let wanted = [
        (DType::F64, "forward", "unfold", true),
        (DType::F32, "forward", "unfold", true),
        (DType::F32, "forward", "shifted", cpu.avx2_fma),
        (DType::F32, "forward", "positions", cpu.avx512f),
        (DType::BF16, "forward", "panels", bf16 || tiles),
        (DType::BF16, "forward", "direct", bf16),
        (DType::BF16, "forward", "positions", bf16),
        (DType::BF16, "forward", "grid", tiles),
        (DType::F64, "input", "fold", true),
        (DType::F64, "input", "transposed", true),
        (DType::F32, "input", "shifted", cpu.avx2_fma),
        (DType::F32, "input", "positions", cpu.avx512f),
        (DType::BF16, "input", "fold", true),
        (DType::BF16, "input", "transposed", true),
        (DType::BF16, "input", "transposed-direct", bf16),
        (DType::BF16, "input", "positions", bf16),
        (DType::BF16, "input", "transposed-grid", tiles),
        (DType::F64, "weight", "unfold", true),
        (DType::F32, "weight", "shifted", cpu.avx2_fma),
        (DType::F32, "weight", "positions", cpu.avx512f),
        (DType::BF16, "weight", "unfold", true),
        (DType::BF16, "weight", "positions", bf16),
        (DType::BF16, "weight", "grid", tiles),
    ];
    for (dtype, pass, path, runs_here) in wanted {
        assert!(
            !runs_here || ran.contains(&(dtype, pass, path)),
            "no case ran {dtype:?} {pass} {path} on {cpu:?}"
        );
    }
}

/// CPUs as the planner sees them, to check its choices on any machine.
const AVX2: Cpu = Cpu {
    avx2_fma: true,
    avx512: false,
    avx512f: false,
    bf16: false,
    tiles: false,
};
const AVX512_BF16: Cpu = Cpu {
    avx2_fma: true,
    avx512: true,
    avx512f: true,
    bf16: true,
    tiles: false,
};
const AMX: Cpu = Cpu {
    tiles: true,
    ..AVX512_BF16
};

#[test]
fn the_planner_takes_the_measured_paths() {
    let auto = Override::default();
    let at = |g: &Conv2dGeometry, o, dtype, cpu: &Cpu| plan(g, o, dtype, cpu, auto).unwrap().to_string();
    let body_32 = square(64, 64, [32, 32], 3, 1, 1);
    let body_4 = square(64, 512, [4, 4], 3, 1, 1);
    let stem = square(64, 3, [32, 32], 3, 1, 1);
    let cases = [
        // AVX2: shifted copies for same-size stride-1 convolutions, but not a 4x4 weight
        // gradient; bf16 widened to the same paths; three input channels fold columns back.
        (body_32, 64, DType::F32, AVX2, "shifted / shifted / shifted"),
        (body_4, 512, DType::F32, AVX2, "shifted / shifted / unfold"),
        (
            body_32,
            64,
            DType::BF16,
            AVX2,
            "shifted / shifted / shifted (widened to f32)",
        ),
        (stem, 64, DType::F32, AVX2, "shifted / fold / shifted"),
        // AVX-512: positions where enough taps read padding, else gemm; bf16 on its kernel;
        // f64 on gemm everywhere.
        (body_32, 64, DType::F32, AVX512_BF16, "unfold / transposed / unfold"),
        (
            body_4,
            512,
            DType::F32,
            AVX512_BF16,
            "positions / positions / positions",
        ),
        (
            body_32,
            64,
            DType::BF16,
            AVX512_BF16,
            "direct / transposed-direct / unfold",
        ),
        (
            body_4,
            512,
            DType::BF16,
            AVX512_BF16,
            "positions / positions / positions",
        ),
        (body_4, 512, DType::F64, AVX512_BF16, "unfold / transposed / unfold"),
        // AMX: bf16 reads stride-1 convolutions from a padded copy where little of it is
        // padding, else unfolds into the tiles' panels, and folds back where the input
        // gradient has too few channels (or a stride) for the transposed convolution; f32 as
        // without tiles.
        (
            body_32,
            64,
            DType::BF16,
            AMX,
            "grid / transposed-grid / grid (on AMX tiles)",
        ),
        (stem, 64, DType::BF16, AMX, "panels / fold / unfold (on AMX tiles)"),
        (
            body_4,
            512,
            DType::BF16,
            AMX,
            "panels / transposed / unfold (on AMX tiles)",
        ),
        (body_4, 512, DType::F32, AMX, "positions / positions / positions"),
    ];
    for (g, o, dtype, cpu, want) in cases {
        assert_eq!(at(&g, o, dtype, &cpu), want, "{g:?} into {o}, {dtype:?} on {cpu:?}");
    }
    assert_eq!(plan(&body_4, 512, DType::U32, &AVX2, auto), None);
}

#[test]
fn forced_paths_run_where_they_can_and_leave_the_rest_automatic() {
    let force = |value: &str| Override::parse(value).unwrap();
    let body_32 = square(64, 64, [32, 32], 3, 1, 1);
    let strided = square(64, 64, [32, 32], 3, 2, 1);
    let at = |g: &Conv2dGeometry, dtype, value| plan(g, 64, dtype, &AVX512_BF16, force(value)).unwrap().to_string();
    assert_eq!(at(&body_32, DType::F32, "shifted"), "shifted / shifted / shifted");
    // Strided: shifted cannot run, so each pass keeps its automatic path.
    assert_eq!(at(&strided, DType::F32, "shifted"), "unfold / fold / unfold");
    assert_eq!(at(&body_32, DType::BF16, "unfold"), "direct / fold / unfold");
    assert_eq!(
        at(&body_32, DType::BF16, "forward=panels,input=transposed"),
        "panels / transposed / unfold"
    );
    assert_eq!(at(&body_32, DType::F32, "auto"), "unfold / transposed / unfold");
    assert_eq!(
        force("unfold"),
        Override {
            forward: Some(Forward::Unfold),
            input: Some(InputGrad::Fold),
            weight: Some(WeightGrad::Unfold),
        }
    );
    for bad in ["sideways", "forward=fold", "sideways=unfold"] {
        assert!(Override::parse(bad).is_err(), "{bad}");
    }
}
