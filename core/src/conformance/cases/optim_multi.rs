//! Cases for the multi-tensor ops `adam_steps`, `sgd_steps`, `sum_of_squares`,
//! `scaled_copies`, `non_finite_count` and `cast_copies`: several tensors of odd lengths (an empty one, a single element, one longer
//! than a CPU chunk), each parameter with its own step count and weight decay, checked against
//! the per-tensor oracles.

use super::optim::{DTYPES, adam_ref, sgd_ref, u};
use crate::backend::{AdamOperands, AdamStep, SgdOperands, SgdStep};
use crate::conformance::case::{Case, Input, Values};
use crate::conformance::host::HostTensor;
use crate::dtype::DType;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The tensors' lengths: empty, one element, odd, and past one chunk of the CPU's updates
/// (16384) and sums (8192) and of a CUDA block.
const LENS: [usize; 5] = [7, 0, 1, 301, 16_411];

/// Parameter `k`'s Adam update: its own step count and weight decay.
fn adam_step_of(k: usize, decoupled: bool) -> AdamStep {
    AdamStep {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.02 * k as f64,
        decoupled,
        step: 1 + 3 * k as u64,
    }
}

fn adam_steps_case(decoupled: bool) -> Case {
    let label = if decoupled { "adamw" } else { "adam" };
    let mut case = Case::new(format!("adam_steps/{label}"), &["adam_steps"], move |ctx, x| {
        let items: Vec<AdamOperands> = x
            .chunks(4)
            .enumerate()
            .map(|(k, t)| AdamOperands {
                param: t[0].buffer(),
                grad: t[1].buffer(),
                exp_avg: t[2].buffer(),
                exp_avg_sq: t[3].buffer(),
                step: adam_step_of(k, decoupled),
            })
            .collect();
        ctx.device.backend().adam_steps(&items)?;
        Ok(x.chunks(4)
            .flat_map(|t| [t[0].clone(), t[2].clone(), t[3].clone()])
            .collect())
    });
    for n in LENS {
        case = case
            .input(Input::float("param", [n], u()))
            .input(Input::float("grad", [n], u()))
            .input(Input::float("exp_avg", [n], Values::Uniform { low: -0.5, high: 0.5 }))
            .input(Input::float(
                "exp_avg_sq",
                [n],
                Values::Uniform { low: 0.01, high: 1.0 },
            ));
    }
    case.forward_only().dtypes(DTYPES).oracle(move |x| {
        x.chunks(4)
            .enumerate()
            .flat_map(|(k, t)| adam_ref(t, adam_step_of(k, decoupled)))
            .collect()
    })
}

/// Parameter `k`'s SGD update; even parameters have a momentum buffer (on its first step for
/// the first of them), odd ones none.
fn sgd_step_of(k: usize) -> (SgdStep, bool) {
    let momentum = k.is_multiple_of(2);
    let step = SgdStep {
        lr: 0.05,
        momentum: if momentum { 0.9 } else { 0.0 },
        dampening: if k == 2 { 0.3 } else { 0.0 },
        weight_decay: 0.01 * k as f64,
        nesterov: k == 4,
        first_step: k == 0,
    };
    (step, momentum)
}

fn sgd_steps_case() -> Case {
    let mut case = Case::new("sgd_steps", &["sgd_steps"], |ctx, x| {
        let items: Vec<SgdOperands> = x
            .chunks(3)
            .enumerate()
            .map(|(k, t)| {
                let (step, momentum) = sgd_step_of(k);
                SgdOperands {
                    param: t[0].buffer(),
                    grad: t[1].buffer(),
                    momentum_buf: momentum.then(|| t[2].buffer()),
                    step,
                }
            })
            .collect();
        ctx.device.backend().sgd_steps(&items)?;
        Ok(x.chunks(3).flat_map(|t| [t[0].clone(), t[2].clone()]).collect())
    });
    for n in LENS {
        case = case
            .input(Input::float("param", [n], u()))
            .input(Input::float("grad", [n], u()))
            .input(Input::float("momentum_buf", [n], u()));
    }
    case.forward_only().dtypes(DTYPES).oracle(|x| {
        x.chunks(3)
            .enumerate()
            .flat_map(|(k, t)| {
                let (step, momentum) = sgd_step_of(k);
                let mut out = sgd_ref(&t[0], &t[1], momentum.then_some(&t[2]), step);
                // A parameter without momentum leaves its would-be buffer alone.
                if !momentum {
                    out.push(t[2].clone());
                }
                out
            })
            .collect()
    })
}

/// The squares of every input, the first one counted twice: two parameters sharing one
/// gradient buffer each count it, as PyTorch's norm over their `.grad`s does.
fn sum_of_squares_case() -> Case {
    let mut case = Case::new("sum_of_squares", &["sum_of_squares"], |ctx, x| {
        let mut bufs: Vec<_> = x.iter().map(Tensor::buffer).collect();
        bufs.push(x[0].buffer());
        let sum = ctx.device.backend().sum_of_squares(&bufs)?;
        Ok(vec![Tensor::from_buffer(sum, Shape::new([1]), ctx.device)])
    });
    for n in LENS {
        case = case.input(Input::float("grad", [n], u()));
    }
    case.forward_only().oracle(|x| {
        let squares = |t: &HostTensor| t.values.iter().map(|v| v * v).sum::<f64>();
        let total = x.iter().map(squares).sum::<f64>() + squares(&x[0]);
        vec![HostTensor::new([1], vec![total])]
    })
}

/// Every input times a factor held as f32 (clipping's coefficient), for gradients of any
/// float dtype.
fn scaled_copies_case() -> Case {
    let mut case = Case::new("scaled_copies", &["scaled_copies"], |ctx, x| {
        let (grads, factor) = x.split_at(x.len() - 1);
        let factor = match ctx.dtype {
            DType::F64 => factor[0].clone(),
            _ => factor[0].to_dtype(DType::F32)?,
        };
        let bufs: Vec<_> = grads.iter().map(Tensor::buffer).collect();
        let out = ctx.device.backend().scaled_copies(&bufs, factor.buffer())?;
        Ok(out
            .into_iter()
            .zip(grads)
            .map(|(b, g)| Tensor::from_buffer(b, g.shape().clone(), ctx.device))
            .collect())
    });
    for n in LENS {
        case = case.input(Input::float("grad", [n], u()));
    }
    case.input(Input::float("factor", [1], Values::Uniform { low: 0.1, high: 1.0 }))
        .forward_only()
        .oracle(|x| {
            let (grads, factor) = x.split_at(x.len() - 1);
            grads.iter().map(|g| g.map(|v| v * factor[0].values[0])).collect()
        })
}

/// `n` small finite values with inf, -inf and NaN in turn every `every` elements from
/// `k % every` on (none for `every == 0`).
fn poisoned(k: usize, n: usize, every: usize) -> Values {
    let poison = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    Values::Given(
        (0..n)
            .map(|i| match every {
                0 => (i % 17) as f64 / 4.0 - 2.0,
                _ if i % every == k % every => poison[i / every % 3],
                _ => (i % 17) as f64 / 4.0 - 2.0,
            })
            .collect(),
    )
}

/// The dtype input `k` is counted in: the one under test, bf16 or f32 in turn, so a call mixes
/// 16- and 32-bit buffers (f16 too where f16 is under test).
fn mixed_dtype(k: usize, under_test: DType) -> DType {
    [under_test, DType::BF16, DType::F32][k % 3]
}

/// The inf and NaN elements of the inputs (one all finite, one empty, one a single inf, one
/// past a chunk), the first counted twice as a gradient two parameters share; `mixed`: in
/// turn in the dtype under test, bf16 and f32, else all in the dtype under test.
fn non_finite_count_case(mixed: bool) -> Case {
    let name = if mixed {
        "non_finite_count/mixed"
    } else {
        "non_finite_count"
    };
    let mut case = Case::new(name, &["non_finite_count"], move |ctx, x| {
        let inputs = x
            .iter()
            .enumerate()
            .map(|(k, t)| match ctx.dtype {
                // The reference counts in f64 throughout.
                DType::F64 => Ok(t.clone()),
                under_test if mixed => t.to_dtype(mixed_dtype(k, under_test)),
                _ => Ok(t.clone()),
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let mut bufs: Vec<_> = inputs.iter().map(Tensor::buffer).collect();
        bufs.push(inputs[0].buffer());
        let count = ctx.device.backend().non_finite_count(&bufs)?;
        Ok(vec![Tensor::from_buffer(count, Shape::new([1]), ctx.device)])
    });
    for (k, (n, every)) in LENS.into_iter().zip([3, 0, 1, 50, 997]).enumerate() {
        case = case.input(Input::float("grad", [n], poisoned(k, n, every)));
    }
    case = case.input(Input::float("clean", [301], poisoned(0, 301, 0)));
    case.forward_only().oracle(|x| {
        let count = |t: &HostTensor| t.values.iter().filter(|v| !v.is_finite()).count() as f64;
        let total = x.iter().map(count).sum::<f64>() + count(&x[0]);
        vec![HostTensor::new([1], vec![total])]
    })
}

/// Autocast's weight copies: every input as f32 cast to bf16 (f16 where f16 is under test), bit
/// for bit what `cast` gives each on the same device (else the case errs), then back to the
/// evaluation's dtype for the comparison with the reference; values that tie halfway between
/// two bf16s round to even.
fn cast_copies_case() -> Case {
    let mut case = Case::new("cast_copies", &["cast_copies"], |ctx, x| {
        let target = if ctx.under_test == DType::F16 {
            DType::F16
        } else {
            DType::BF16
        };
        let sources = x
            .iter()
            .map(|t| t.to_dtype(DType::F32))
            .collect::<crate::Result<Vec<_>>>()?;
        let backend = ctx.device.backend();
        let bufs: Vec<_> = sources.iter().map(Tensor::buffer).collect();
        let copies = backend.cast_copies(&bufs, target)?;
        let mut out = Vec::new();
        for (copy, source) in copies.into_iter().zip(&sources) {
            let single = backend.cast(source.buffer(), source.layout(), target)?;
            let layout = crate::shape::Layout::contiguous([source.elem_count()]);
            let bits = |b: &crate::backend::BufferRef| {
                backend
                    .to_host(b, &layout)
                    .map(|h| h.to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            };
            if bits(&copy)? != bits(&single)? {
                return Err(crate::Error::invalid("cast_copies", "a copy differs from `cast`'s"));
            }
            out.push(Tensor::from_buffer(copy, source.shape().clone(), ctx.device).to_dtype(ctx.dtype)?);
        }
        Ok(out)
    });
    for n in LENS {
        case = case.input(Input::float("weight", [n], u()));
    }
    let tie = 2f64.powi(-8);
    let ties = vec![1.0 + tie, 1.0 + 3.0 * tie, -(1.0 + tie), -0.0, 1.0e30, 1.0e-30];
    case.input(Input::float("ties", [6], Values::Given(ties)))
        .forward_only()
}

pub fn cases() -> Vec<Case> {
    vec![
        adam_steps_case(false),
        adam_steps_case(true),
        sgd_steps_case(),
        sum_of_squares_case(),
        scaled_copies_case(),
        non_finite_count_case(false),
        non_finite_count_case(true),
        cast_copies_case(),
    ]
}
