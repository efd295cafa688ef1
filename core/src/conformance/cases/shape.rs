//! Cases for layout and indexing: `contiguous` copies, `copy_strided` (writes into slices,
//! concat), `index_select`/`index_add` and `gather`/`scatter_add` (their backward passes).

use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host::{self, HostTensor};
use crate::error::Result;
use crate::tensor::Tensor;

fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

const OVERLAP_LEN: usize = 1 << 16;
const OVERLAP_SHIFT: usize = 3;

fn copy_cases() -> Vec<Case> {
    vec![
        Case::new("contiguous/permute3", &["contiguous"], |_, x| {
            Ok(vec![x[0].contiguous()?])
        })
        .input(Input::float("x", [2, 3, 4], u()).view(View::Permute(vec![2, 0, 1])))
        .oracle(|x| vec![x[0].clone()]),
        Case::new("contiguous/bcast", &["contiguous"], |_, x| Ok(vec![x[0].contiguous()?]))
            .input(Input::float("x", [3, 1], u()).broadcast([2, 3, 5]))
            .oracle(|x| vec![x[0].clone()]),
        Case::new("contiguous/reshape_T", &["contiguous"], |_, x| {
            Ok(vec![x[0].reshape([91])?])
        })
        .input(Input::float("x", [7, 13], u()).transposed())
        .oracle(|x| vec![x[0].reshape([91])]),
        // narrow's backward writes the gradient into a window of a zero tensor.
        Case::new("copy_strided/narrow", &["copy_strided", "to_host"], |_, x| {
            Ok(vec![x[0].narrow(1, 2, 3)?.narrow(0, 1, 4)?])
        })
        .input(Input::float("x", [6, 7], u()))
        .oracle(|x| vec![x[0].narrow(1, 2, 3).narrow(0, 1, 4)]),
        Case::new("copy_strided/concat0", &["copy_strided"], |_, x| {
            Ok(vec![Tensor::concat(&[&x[0], &x[1], &x[2]], 0)?])
        })
        .input(Input::float("a", [2, 5], u()))
        .input(Input::float("b", [3, 5], u()).transposed())
        .input(Input::float("c", [0, 5], u()))
        .oracle(|x| vec![host::concat(&[&x[0], &x[1], &x[2]], 0)]),
        Case::new("copy_strided/concat_last", &["copy_strided"], |_, x| {
            Ok(vec![Tensor::concat(&[&x[0], &x[1]], -1)?])
        })
        .input(Input::float("a", [2, 3, 1], u()))
        .input(Input::float("b", [2, 3, 4], u()).view(View::Narrow {
            axis: 2,
            start: 1,
            len: 2,
        }))
        .oracle(|x| vec![host::concat(&[&x[0], &x[1]], 2)]),
        // Source and destination overlap in one buffer, shifted both ways: long enough that
        // GPU threads of different blocks would read what others already wrote.
        Case::new("copy_strided/overlap", &["copy_strided", "unary:affine"], |_, x| {
            let shift = |by_right: bool| -> Result<Tensor> {
                let t = x[0].affine(1.0, 0.0)?;
                let (from, to) = if by_right {
                    (0, OVERLAP_SHIFT)
                } else {
                    (OVERLAP_SHIFT, 0)
                };
                let len = OVERLAP_LEN - OVERLAP_SHIFT;
                t.narrow(0, to, len)?.assign(&t.narrow(0, from, len)?)?;
                Ok(t)
            };
            Ok(vec![shift(true)?, shift(false)?])
        })
        .input(Input::float("x", [OVERLAP_LEN], u()))
        .forward_only()
        .oracle(|x| {
            let v = &x[0].values;
            let right = (0..OVERLAP_LEN).map(|i| v[i.checked_sub(OVERLAP_SHIFT).unwrap_or(i)]);
            let left = (0..OVERLAP_LEN).map(|i| {
                v[if i + OVERLAP_SHIFT < OVERLAP_LEN {
                    i + OVERLAP_SHIFT
                } else {
                    i
                }]
            });
            vec![
                HostTensor::new([OVERLAP_LEN], right.collect()),
                HostTensor::new([OVERLAP_LEN], left.collect()),
            ]
        }),
        // A write through a strided destination (a column slice of a larger buffer).
        Case::new("copy_strided/assign_slice", &["copy_strided", "zeros"], |ctx, x| {
            let dst = Tensor::zeros([4, 6], ctx.dtype, ctx.device)?;
            dst.narrow(1, 1, 3)?.assign(&x[0])?;
            Ok(vec![dst])
        })
        .input(Input::float("src", [4, 3], u()).transposed())
        .forward_only()
        .oracle(|x| {
            vec![HostTensor::from_fn([4, 6], |i| {
                if (1..4).contains(&i[1]) {
                    x[0].at(&[i[0], i[1] - 1])
                } else {
                    0.0
                }
            })]
        }),
    ]
}

fn index_cases() -> Vec<Case> {
    vec![
        // Repeated indices: index_add (the backward) must accumulate, not overwrite.
        Case::new("index_select/rows", &["index_select", "index_add"], |_, x| {
            Ok(vec![x[0].index_select(0, &x[1])?])
        })
        .input(Input::float("x", [5, 4], u()))
        .input(Input::indices("ids", [7], 5))
        .oracle(|x| vec![host::index_select(&x[0], 0, &x[1])]),
        Case::new(
            "index_select/middle_i64",
            &["index_select", "index_add", "cast"],
            |_, x| Ok(vec![x[0].index_select(1, &x[1])?]),
        )
        .input(Input::float("x", [3, 6, 2], u()))
        .input(Input::labels_i64("ids", [4], 6))
        .oracle(|x| vec![host::index_select(&x[0], 1, &x[1])]),
        Case::new(
            "index_select/T",
            &["index_select", "index_add", "copy_strided"],
            |_, x| Ok(vec![x[0].index_select(1, &x[1])?]),
        )
        .input(Input::float("x", [7, 13], u()).transposed())
        .input(Input::indices("ids", [9], 7))
        .oracle(|x| vec![host::index_select(&x[0], 1, &x[1])]),
        Case::new("index_select/empty", &["index_select", "index_add"], |_, x| {
            Ok(vec![x[0].index_select(0, &x[1])?])
        })
        .input(Input::float("x", [4, 3], u()))
        .input(Input::indices("ids", [0], 4))
        .oracle(|x| vec![host::index_select(&x[0], 0, &x[1])]),
        Case::new("gather/last", &["gather", "scatter_add"], |_, x| {
            Ok(vec![x[0].gather(1, &x[1])?])
        })
        .input(Input::float("x", [4, 6], u()))
        .input(Input::indices("ids", [4, 9], 6))
        .oracle(|x| vec![host::gather(&x[0], 1, &x[1])]),
        Case::new("gather/first", &["gather", "scatter_add"], |_, x| {
            Ok(vec![x[0].gather(0, &x[1])?])
        })
        .input(Input::float("x", [3, 4, 5], u()))
        .input(Input::indices("ids", [2, 4, 5], 3))
        .oracle(|x| vec![host::gather(&x[0], 0, &x[1])]),
        Case::new("gather/T_i64", &["gather", "scatter_add", "cast"], |_, x| {
            Ok(vec![x[0].gather(1, &x[1])?])
        })
        .input(Input::float("x", [5, 3], u()).transposed())
        .input(Input::labels_i64("ids", [5, 2], 3))
        .oracle(|x| vec![host::gather(&x[0], 1, &x[1])]),
    ]
}

pub fn cases() -> Vec<Case> {
    let mut all = copy_cases();
    all.extend(index_cases());
    all
}
