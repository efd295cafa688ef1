//! Cases for the buffer methods: `zeros`, `full`, `from_host`, `to_host` (strided reads),
//! `rand` (the counter-based streams every backend must reproduce) and `cast`.

use crate::conformance::case::{Case, Input, Values, View};
use crate::conformance::host::HostTensor;
use crate::dtype::DType;
use crate::rng::{self, Generator};
use crate::tensor::Tensor;

fn u() -> Values {
    Values::Uniform { low: -2.0, high: 2.0 }
}

fn fill_cases() -> Vec<Case> {
    vec![
        Case::new("zeros", &["zeros"], |ctx, _| {
            Ok(vec![
                Tensor::zeros([7, 13], ctx.dtype, ctx.device)?,
                Tensor::zeros([5], DType::U32, ctx.device)?,
                Tensor::zeros([0, 3], ctx.dtype, ctx.device)?,
            ])
        })
        .forward_only()
        .oracle(|_| {
            vec![
                HostTensor::new([7, 13], vec![0.0; 91]),
                HostTensor::new([5], vec![0.0; 5]),
                HostTensor::new([0, 3], vec![]),
            ]
        }),
        Case::new("full", &["full"], |ctx, _| {
            Ok(vec![
                Tensor::full([7, 13], -2.75, ctx.dtype, ctx.device)?,
                Tensor::full([3, 2], 7.0, DType::U32, ctx.device)?,
                Tensor::full([4], -3.0, DType::I64, ctx.device)?,
                Tensor::full([], 0.5, ctx.dtype, ctx.device)?,
            ])
        })
        .forward_only()
        .oracle(|_| {
            vec![
                HostTensor::new([7, 13], vec![-2.75; 91]),
                HostTensor::new([3, 2], vec![7.0; 6]),
                HostTensor::new([4], vec![-3.0; 4]),
                HostTensor::new([], vec![0.5]),
            ]
        }),
    ]
}

fn transfer_cases() -> Vec<Case> {
    let identity = |_: &crate::conformance::case::Ctx, x: &[Tensor]| Ok(x.to_vec());
    vec![
        Case::new("from_host/dtypes", &["from_host", "to_host"], identity)
            .input(Input::float("x", [7, 13], Values::Normal { mean: 0.0, std: 10.0 }))
            .input(Input::indices("u", [11], 1 << 20))
            .input(Input::labels_i64("i", [3, 3], 1 << 40))
            .forward_only()
            .oracle(|x| x.to_vec()),
        // Reads of strided layouts with an offset: the backend gathers in row-major order.
        Case::new("to_host/strided", &["to_host"], identity)
            .input(
                Input::float("x", [6, 8], u())
                    .transposed()
                    .view(View::Narrow {
                        axis: 0,
                        start: 2,
                        len: 4,
                    })
                    .view(View::Narrow {
                        axis: 1,
                        start: 1,
                        len: 5,
                    }),
            )
            .input(Input::float("y", [1, 3], u()).broadcast([2, 4, 3]))
            .input(Input::indices("ids", [4, 5], 9).view(View::Permute(vec![1, 0])))
            .input(Input::float("e", [3, 4], u()).view(View::Narrow {
                axis: 0,
                start: 3,
                len: 0,
            }))
            .forward_only()
            .oracle(|x| x.to_vec()),
    ]
}

fn rand_cases() -> Vec<Case> {
    // Two draws from one generator that does not start at 0, of sizes that are not multiples of
    // 4: checks where each draw's counter starts, not only the values.
    let draw = |ctx: &crate::conformance::case::Ctx, _: &[Tensor]| {
        let g = Generator::from_state(ctx.seed, 3);
        let a = Tensor::rand_uniform([7, 13], -1.5, 2.5, ctx.dtype, &g, ctx.device)?;
        let b = Tensor::rand_normal([5, 3], 0.5, 2.0, ctx.dtype, &g, ctx.device)?;
        let c = Tensor::rand_uniform([0, 3], 0.0, 1.0, ctx.dtype, &g, ctx.device)?;
        Ok(vec![a, b, c])
    };
    let seed = Case::new("rand", &[], draw).seed();
    vec![Case::new("rand", &["rand"], draw).forward_only().oracle(move |_| {
        let a = HostTensor::new(
            [7, 13],
            (0..91).map(|i| -1.5 + 4.0 * rng::uniform_at(seed, 3, i)).collect(),
        );
        // The first draw used ceil(91 / 4) = 23 counters.
        let b = HostTensor::new(
            [5, 3],
            (0..15).map(|i| 0.5 + 2.0 * rng::normal_at(seed, 26, i)).collect(),
        );
        vec![a, b, HostTensor::new([0, 3], vec![])]
    })]
}

/// The float dtype a cast case converts to: another one than the dtype under test.
fn partner(dtype: DType) -> DType {
    if dtype == DType::F32 { DType::F16 } else { DType::F32 }
}

fn cast_cases() -> Vec<Case> {
    vec![
        // Through the partner dtype and back: rounds like the partner, differentiable.
        Case::new("cast/float", &["cast"], |ctx, x| {
            Ok(vec![
                x[0].to_dtype(partner(ctx.under_test))?
                    .to_dtype(ctx.dtype)?
                    .mul(&x[0])?,
            ])
        })
        .input(Input::float("x", [7, 13], u()))
        // Rounding to the partner makes finite differences meaningless.
        .no_gradcheck(),
        // Float to integer truncates toward zero; integer to float is exact for these values.
        Case::new("cast/int", &["cast"], |ctx, x| {
            Ok(vec![
                x[0].to_dtype(DType::U32)?,
                x[0].to_dtype(DType::I64)?,
                x[1].to_dtype(ctx.dtype)?,
                x[1].to_dtype(DType::I64)?,
                x[2].to_dtype(DType::U32)?,
            ])
        })
        .input(Input::float("x", [4, 5], Values::Uniform { low: 0.0, high: 50.0 }).transposed())
        .input(Input::indices("u", [9], 1000))
        .input(Input::labels_i64("i", [2, 3], 1000))
        .forward_only()
        .oracle(|x| {
            vec![
                x[0].map(f64::trunc),
                x[0].map(f64::trunc),
                x[1].clone(),
                x[1].clone(),
                x[2].clone(),
            ]
        }),
    ]
}

pub fn cases() -> Vec<Case> {
    let mut all = fill_cases();
    all.extend(transfer_cases());
    all.extend(rand_cases());
    all.extend(cast_cases());
    all
}
