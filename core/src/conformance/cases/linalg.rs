//! Cases for `matmul`: odd sizes, transposed operands (no copy), batches with broadcast batch
//! axes (stride 0), and the degenerate k = 0, m = 0 and 1x1 products.

use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host;

pub fn cases() -> Vec<Case> {
    let u = Values::Uniform { low: -1.0, high: 1.0 };
    let a = |shape: &[usize]| Input::float("a", shape.to_vec(), u.clone());
    let b = |shape: &[usize]| Input::float("b", shape.to_vec(), u.clone());
    let shapes: Vec<(&str, Input, Input)> = vec![
        ("7x13@13x5", a(&[7, 13]), b(&[13, 5])),
        ("aT", a(&[7, 13]).transposed(), b(&[13, 5])),
        ("bT", a(&[7, 13]), b(&[13, 5]).transposed()),
        ("aT_bT", a(&[6, 4]).transposed(), b(&[4, 9]).transposed()),
        ("batched", a(&[3, 4, 6]), b(&[3, 6, 5])),
        ("bcast_rhs", a(&[3, 4, 6]), b(&[6, 5])),
        ("bcast_batch", a(&[2, 1, 4, 6]), b(&[3, 6, 5])),
        (
            "bcast_view",
            a(&[1, 4, 6]).broadcast([3, 4, 6]),
            b(&[3, 6, 5]).transposed(),
        ),
        (
            "narrow",
            a(&[5, 9]).view(View::Narrow {
                axis: 1,
                start: 2,
                len: 6,
            }),
            b(&[6, 8]).view(View::Narrow {
                axis: 1,
                start: 1,
                len: 3,
            }),
        ),
        // Views that start mid-word for a 16-bit dtype, with an even n (wgpu packs bf16
        // products two columns a word).
        (
            "narrow_even",
            a(&[5, 9]).view(View::Narrow {
                axis: 1,
                start: 1,
                len: 7,
            }),
            b(&[7, 8]).view(View::Narrow {
                axis: 1,
                start: 3,
                len: 4,
            }),
        ),
        (
            "permuted_batch",
            a(&[4, 3, 6]).view(View::Permute(vec![1, 0, 2])),
            b(&[3, 6, 2]),
        ),
        ("k0", a(&[3, 0]), b(&[0, 4])),
        ("m0", a(&[0, 5]), b(&[5, 3])),
        ("1x1", a(&[1, 1]), b(&[1, 1])),
        ("vec", a(&[1, 17]), b(&[17, 1])),
        ("33x65@65x17", a(&[33, 65]), b(&[65, 17])),
        // Larger transposed operands: the GEMM's packing takes other paths past a few thousand elements.
        ("large_bT", a(&[5, 150]), b(&[150, 120]).transposed()),
        ("large_bT_bcast", a(&[2, 3, 150]), b(&[150, 120]).transposed()),
        // Small output, long sum: the CPU splits k across threads (a convolution's weight gradient).
        ("large_k", a(&[3, 5000]), b(&[5000, 4])),
        ("large_k_aT", a(&[3, 6000]).transposed(), b(&[6000, 2])),
        // wgpu splits such a k across workgroups; here with a batch, a short last chunk and an
        // odd n (bf16 sums written two a word across rows).
        ("large_k_batched_odd_n", a(&[2, 3, 2100]), b(&[2, 2100, 5]).transposed()),
    ];
    shapes
        .into_iter()
        .map(|(label, a, b)| {
            let k = *a.logical_shape().last().unwrap_or(&1);
            let large = label.starts_with("large");
            let case = Case::new(format!("matmul/{label}"), &["matmul"], |_, x| {
                Ok(vec![x[0].matmul(&x[1])?])
            });
            // Finite differences over 18,000 inputs would dominate the suite's time; the small
            // transposed cases check the same gradient rules.
            let case = if large { case.no_gradcheck() } else { case };
            case.input(a)
                .input(b)
                // Dot products of length k: the error grows like sqrt(k) (more with pairwise or
                // blocked summation orders differing from the reference's).
                .tol_scale((k as f64).sqrt() / 2.0 + 1.0)
                .oracle(|x| vec![host::matmul(&x[0], &x[1])])
        })
        .collect()
}
