//! The CPU's multi-tensor ops against the per-tensor ones: the updates bit for bit, the sum of
//! squares the same whatever the thread count and close to the composed default, and the
//! refusals of buffers passed twice.

use lockstep_core::backend::multi_tensor::{scaled_copies_composed, sum_of_squares_composed};
use lockstep_core::backend::{AdamOperands, AdamStep, BufferRef, SgdOperands, SgdStep};
use lockstep_core::{DType, Device, HostVec, Tensor};

/// Lengths that cross the CPU's chunks (16384 for updates, 8192 for sums) and include 0 and 1.
const LENS: [usize; 6] = [40_000, 0, 1, 17, 9000, 3];

fn device() -> Device {
    Device::parse("cpu:2").unwrap()
}

/// Deterministic values in [-2, 2) for tensor `k`, in `dtype`.
fn values(dev: &Device, k: usize, n: usize, dtype: DType) -> BufferRef {
    let v: Vec<f64> = (0..n)
        .map(|i| ((i * 7919 + k * 104_729) % 4001) as f64 / 1000.25 - 2.0)
        .collect();
    Tensor::from_host(HostVec::from_f64(dtype, &v), [n], dev)
        .unwrap()
        .buffer()
        .clone()
}

fn bits(b: &BufferRef) -> Vec<u64> {
    let t = Tensor::from_buffer(b.clone(), [b.len()], &device());
    t.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect()
}

/// Parameter, gradient and two state buffers per length, and the same again, for comparing
/// two ways of updating them.
fn operand_sets(dev: &Device, dtype: DType) -> [Vec<[BufferRef; 4]>; 2] {
    let make = || -> Vec<[BufferRef; 4]> {
        LENS.iter()
            .enumerate()
            .map(|(k, &n)| std::array::from_fn(|r| values(dev, 4 * k + r, n, dtype)))
            .collect()
    };
    [make(), make()]
}

fn adam_step_of(k: usize) -> AdamStep {
    AdamStep {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01 * k as f64,
        decoupled: k.is_multiple_of(2),
        step: 1 + k as u64,
    }
}

#[test]
fn adam_steps_equal_one_adam_step_per_parameter_bit_for_bit() {
    let dev = device();
    let backend = dev.backend();
    for dtype in [DType::F32, DType::F64] {
        let [one_by_one, together] = operand_sets(&dev, dtype);
        for (k, [p, g, m, v]) in one_by_one.iter().enumerate() {
            backend.adam_step(p, g, m, v, &adam_step_of(k)).unwrap();
        }
        let items: Vec<AdamOperands> = together
            .iter()
            .enumerate()
            .map(|(k, [p, g, m, v])| AdamOperands {
                param: p,
                grad: g,
                exp_avg: m,
                exp_avg_sq: v,
                step: adam_step_of(k),
            })
            .collect();
        backend.adam_steps(&items).unwrap();
        for (a, b) in one_by_one.iter().zip(&together) {
            for r in [0, 2, 3] {
                assert_eq!(
                    bits(&a[r]),
                    bits(&b[r]),
                    "{dtype}: buffer {r} of a {}-element parameter",
                    a[0].len()
                );
            }
        }
    }
}

#[test]
fn sgd_steps_equal_one_sgd_step_per_parameter_bit_for_bit() {
    let dev = device();
    let backend = dev.backend();
    let step_of = |k: usize| SgdStep {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.01 * k as f64,
        nesterov: k == 3,
        first_step: k == 1,
    };
    let [one_by_one, together] = operand_sets(&dev, DType::F32);
    for (k, [p, g, b, _]) in one_by_one.iter().enumerate() {
        backend
            .sgd_step(p, g, (k.is_multiple_of(2)).then_some(b), &step_of(k))
            .unwrap();
    }
    let items: Vec<SgdOperands> = together
        .iter()
        .enumerate()
        .map(|(k, [p, g, b, _])| SgdOperands {
            param: p,
            grad: g,
            momentum_buf: (k.is_multiple_of(2)).then_some(b),
            step: step_of(k),
        })
        .collect();
    backend.sgd_steps(&items).unwrap();
    for (a, b) in one_by_one.iter().zip(&together) {
        assert_eq!(bits(&a[0]), bits(&b[0]));
        assert_eq!(bits(&a[2]), bits(&b[2]));
    }
}

#[test]
fn sum_of_squares_is_the_same_for_any_thread_count_and_close_to_the_composed_sum() {
    let dev = device();
    let backend = dev.backend().clone();
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let bufs: Vec<BufferRef> = LENS
            .iter()
            .enumerate()
            .map(|(k, &n)| values(&dev, k, n, dtype))
            .collect();
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let sum_with = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let sum = pool.install(|| backend.sum_of_squares(&refs).unwrap());
            bits(&sum)
        };
        let one = sum_with(1);
        assert_eq!(one, sum_with(3), "{dtype}");
        assert_eq!(one, sum_with(8), "{dtype}");
        let native = f64::from_bits(one[0]);
        let composed = Tensor::from_buffer(sum_of_squares_composed(&*backend, &refs).unwrap(), [1], &dev)
            .item()
            .unwrap();
        let want_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        assert_eq!(backend.sum_of_squares(&refs).unwrap().dtype(), want_dtype);
        assert!(
            ((native - composed) / composed).abs() < 1e-5,
            "{dtype}: native {native}, composed {composed}"
        );
    }
    let empty = backend.sum_of_squares(&[]).unwrap();
    assert_eq!(bits(&empty), vec![0f64.to_bits()], "no buffers sum to zero");
}

#[test]
fn scaled_copies_equal_the_composed_product_bit_for_bit_and_leave_the_sources() {
    let dev = device();
    let backend = dev.backend();
    let factor = Tensor::from_slice(&[0.3f32], [1], &dev).unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let bufs: Vec<BufferRef> = LENS
            .iter()
            .enumerate()
            .map(|(k, &n)| values(&dev, k, n, dtype))
            .collect();
        let before: Vec<_> = bufs.iter().map(bits).collect();
        let refs: Vec<&BufferRef> = bufs.iter().collect();
        let native = backend.scaled_copies(&refs, factor.buffer()).unwrap();
        let composed = scaled_copies_composed(&**backend, &refs, factor.buffer()).unwrap();
        for ((n, c), (b, was)) in native.iter().zip(&composed).zip(bufs.iter().zip(&before)) {
            assert_eq!(n.dtype(), dtype);
            assert_eq!(bits(n), bits(c), "{dtype}");
            assert_eq!(&bits(b), was, "{dtype}: the source changed");
        }
    }
}

#[test]
fn a_buffer_updated_twice_or_also_read_is_refused() {
    let dev = device();
    let backend = dev.backend();
    let [set, other] = operand_sets(&dev, DType::F32);
    let [p, g, m, v] = &set[3];
    let item = |param, grad| AdamOperands {
        param,
        grad,
        exp_avg: m,
        exp_avg_sq: v,
        step: adam_step_of(0),
    };
    let twice = backend.adam_steps(&[item(p, g), item(p, g)]).unwrap_err();
    assert!(twice.to_string().contains("updated twice"), "{twice}");
    let read_and_written = backend.adam_steps(&[item(p, p)]).unwrap_err();
    assert!(read_and_written.to_string().contains("distinct"), "{read_and_written}");
    let q = &other[3];
    let shared_grad = [
        item(p, g),
        AdamOperands {
            param: &q[0],
            grad: g,
            exp_avg: &q[2],
            exp_avg_sq: &q[3],
            step: adam_step_of(1),
        },
    ];
    backend
        .adam_steps(&shared_grad)
        .expect("two parameters may share one gradient");
}
