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
/// batches that leave tiles' lanes empty, and sums long enough for `positions`.
const CASES: [(Conv2dGeometry, usize); 12] = [
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

/// The passes' paths each case and dtype ran, forced one pass at a time.
#[derive(Default)]
struct Ran {
    forward: Vec<(DType, Forward)>,
    input: Vec<(DType, InputGrad)>,
    weight: Vec<(DType, WeightGrad)>,
}

#[test]
fn every_path_forced_through_the_planner_matches_the_f64_reference() {
    let (pool, cpu) = (Pool::default(), Cpu::this());
    let mut ran = Ran::default();
    for (g, o) in CASES {
        let r = reference_with(&pool, g, o);
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (x, w, grad) = (narrow(&r.x, dtype), narrow(&r.w, dtype), narrow(&r.grad, dtype));
            let planned = |force: Override| plan(&g, o, dtype, &cpu, force).expect("a float dtype");
            for path in Forward::ALL {
                let plan = planned(Override {
                    forward: Some(path),
                    ..Override::default()
                });
                if plan.forward != path {
                    continue;
                }
                let out = forward(&pool, &x, &w, &g, o, &plan).expect("one dtype");
                assert!(close(&out, &r.forward, dtype), "forward {g:?} {dtype:?} ({plan})");
                ran.forward.push((dtype, path));
            }
            for path in InputGrad::ALL {
                let plan = planned(Override {
                    input: Some(path),
                    ..Override::default()
                });
                if plan.input != path {
                    continue;
                }
                let (grad_x, _) = backward(&pool, &x, &w, &grad, &g, o, &plan).expect("one dtype");
                assert!(close(&grad_x, &r.grad_x, dtype), "input grad {g:?} {dtype:?} ({plan})");
                ran.input.push((dtype, path));
            }
            for path in WeightGrad::ALL {
                let plan = planned(Override {
                    weight: Some(path),
                    ..Override::default()
                });
                if plan.weight != path {
                    continue;
                }
                let (_, grad_w) = backward(&pool, &x, &w, &grad, &g, o, &plan).expect("one dtype");
                assert!(close(&grad_w, &r.grad_w, dtype), "weight grad {g:?} {dtype:?} ({plan})");
                ran.weight.push((dtype, path));
            }
        }
    }
    // Every path this CPU has the kernels for ran somewhere.
    let wanted = |dtype: DType, needs: bool| needs.then_some(dtype);
    for (dtype, path) in [
        wanted(DType::F64, true).map(|d| (d, Forward::Unfold)),
        wanted(DType::F32, true).map(|d| (d, Forward::Unfold)),
        wanted(DType::F32, cpu.avx2_fma).map(|d| (d, Forward::Shifted)),
        wanted(DType::F32, cpu.avx512f).map(|d| (d, Forward::Positions)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, Forward::Panels)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, Forward::Direct)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, Forward::Positions)),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            ran.forward.contains(&(dtype, path)),
            "no case ran {dtype:?} forward {path}"
        );
    }
    for (dtype, path) in [
        wanted(DType::F64, true).map(|d| (d, InputGrad::Fold)),
        wanted(DType::F64, true).map(|d| (d, InputGrad::Transposed)),
        wanted(DType::F32, cpu.avx2_fma).map(|d| (d, InputGrad::Shifted)),
        wanted(DType::F32, cpu.avx512f).map(|d| (d, InputGrad::Positions)),
        wanted(DType::BF16, true).map(|d| (d, InputGrad::Fold)),
        wanted(DType::BF16, true).map(|d| (d, InputGrad::Transposed)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, InputGrad::TransposedDirect)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, InputGrad::Positions)),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            ran.input.contains(&(dtype, path)),
            "no case ran {dtype:?} input grad {path}"
        );
    }
    for (dtype, path) in [
        wanted(DType::F64, true).map(|d| (d, WeightGrad::Unfold)),
        wanted(DType::F32, cpu.avx2_fma).map(|d| (d, WeightGrad::Shifted)),
        wanted(DType::F32, cpu.avx512f).map(|d| (d, WeightGrad::Positions)),
        wanted(DType::BF16, true).map(|d| (d, WeightGrad::Unfold)),
        wanted(DType::BF16, cpu.bf16).map(|d| (d, WeightGrad::Positions)),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            ran.weight.contains(&(dtype, path)),
            "no case ran {dtype:?} weight grad {path}"
        );
    }
}

/// CPUs as the planner sees them, to check its choices on any machine.
const AVX2: Cpu = Cpu {
    avx2_fma: true,
    avx512: false,
    avx512f: false,
    bf16: false,
};
const AVX512_BF16: Cpu = Cpu {
    avx2_fma: true,
    avx512: true,
    avx512f: true,
    bf16: true,
};

#[test]
fn the_planner_takes_the_measured_paths() {
    let auto = Override::default();
    let at = |g: &Conv2dGeometry, o, dtype, cpu: &Cpu| plan(g, o, dtype, cpu, auto).unwrap().to_string();
    let body_32 = square(64, 64, [32, 32], 3, 1, 1);
    let body_4 = square(64, 512, [4, 4], 3, 1, 1);
    let stem = square(64, 3, [32, 32], 3, 1, 1);
    // AVX2: shifted copies for same-size stride-1 convolutions, but not a 4x4 weight gradient;
    // bf16 widened to the same paths.
    assert_eq!(at(&body_32, 64, DType::F32, &AVX2), "shifted / shifted / shifted");
    assert_eq!(at(&body_4, 512, DType::F32, &AVX2), "shifted / shifted / unfold");
    assert_eq!(
        at(&body_32, 64, DType::BF16, &AVX2),
        "shifted / shifted / shifted (widened to f32)"
    );
    // Three input channels: the input gradient folds columns back.
    assert_eq!(at(&stem, 64, DType::F32, &AVX2), "shifted / fold / shifted");
    // AVX-512: positions where enough taps read padding, else gemm; bf16 on its kernel.
    assert_eq!(
        at(&body_32, 64, DType::F32, &AVX512_BF16),
        "unfold / transposed / unfold"
    );
    assert_eq!(
        at(&body_4, 512, DType::F32, &AVX512_BF16),
        "positions / positions / positions"
    );
    assert_eq!(
        at(&body_32, 64, DType::BF16, &AVX512_BF16),
        "direct / transposed-direct / unfold"
    );
    assert_eq!(
        at(&body_4, 512, DType::BF16, &AVX512_BF16),
        "positions / positions / positions"
    );
    // f64 takes gemm everywhere.
    assert_eq!(
        at(&body_4, 512, DType::F64, &AVX512_BF16),
        "unfold / transposed / unfold"
    );
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
