//! The multi-tensor kernels on cuda:0 at a GPT-like parameter set (many small tensors and a few
//! large ones): the updates equal one per-tensor kernel per parameter bit for bit, the sum of
//! squares equals the CPU's within f32 rounding and repeats bit for bit, the scaled copies equal
//! `binary`'s product, each in one launch per call (two for the sum). A failed start-up check
//! shows here as the per-tensor launch count, with the check's warning above it.

mod support;

use lockstep_core::backend::{AdamOperands, AdamStep, BinaryOp, BufferRef};
use lockstep_core::shape::{Layout, Shape};
use lockstep_core::{DType, Device, HostVec, Tensor};

/// Lengths: empty, single, odd, and a few past one 32768-element chunk.
const LENS: [usize; 9] = [0, 1, 768, 2304, 3 * 768 * 768 + 5, 50257, 1, 768 * 4, 40_000];

fn upload(device: &Device, k: usize, n: usize, dtype: DType) -> BufferRef {
    let v: Vec<f64> = (0..n)
        .map(|i| ((i * 7919 + k * 104_729) % 4001) as f64 / 1000.25 - 2.0)
        .collect();
    device.backend().from_host(&HostVec::from_f64(dtype, &v)).unwrap()
}

fn bits(device: &Device, b: &BufferRef) -> Vec<u64> {
    let host = device.backend().to_host(b, &Layout::contiguous([b.len()])).unwrap();
    host.to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

#[test]
fn multi_tensor_kernels_agree_with_the_per_tensor_ones_in_one_launch() {
    let _counting = support::exclusive();
    let Some(device) = support::cuda_device() else { return };
    let backend = device.backend();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let step = |k: usize| AdamStep {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: if k.is_multiple_of(3) { 0.1 } else { 0.0 },
            decoupled: true,
            step: 1 + k as u64,
        };
        let make = || -> Vec<[BufferRef; 4]> {
            LENS.iter()
                .enumerate()
                .map(|(k, &n)| std::array::from_fn(|r| upload(&device, 4 * k + r, n, dtype)))
                .collect()
        };
        let (one_by_one, together) = (make(), make());
        for (k, [p, g, m, v]) in one_by_one.iter().enumerate() {
            backend.adam_step(p, g, m, v, &step(k)).unwrap();
        }
        let items: Vec<AdamOperands> = together
            .iter()
            .enumerate()
            .map(|(k, [p, g, m, v])| AdamOperands {
                param: p,
                grad: g,
                exp_avg: m,
                exp_avg_sq: v,
                step: step(k),
            })
            .collect();
        backend.adam_steps(&items).unwrap(); // the start-up check runs here, once per dtype
        let before = support::launches(&device);
        backend.adam_steps(&items).unwrap();
        let adam_launches = support::launches(&device) - before;
        for (k, [p, g, m, v]) in one_by_one.iter().enumerate() {
            backend.adam_step(p, g, m, v, &step(k)).unwrap();
        }
        for (a, b) in one_by_one.iter().zip(&together) {
            for r in [0, 2, 3] {
                assert_eq!(
                    bits(&device, &a[r]),
                    bits(&device, &b[r]),
                    "{dtype}: adam_steps, buffer {r}, {} elements",
                    a[0].len()
                );
            }
        }

        let grads: Vec<BufferRef> = LENS
            .iter()
            .enumerate()
            .map(|(k, &n)| upload(&device, k, n, dtype))
            .collect();
        let refs: Vec<&BufferRef> = grads.iter().collect();
        let before = support::launches(&device);
        let sum = backend.sum_of_squares(&refs).unwrap();
        let sum_launches = support::launches(&device) - before;
        let again = backend.sum_of_squares(&refs).unwrap();
        assert_eq!(
            bits(&device, &sum),
            bits(&device, &again),
            "{dtype}: the sum repeats bit for bit"
        );
        let cpu = Device::cpu();
        let want: f64 = grads
            .iter()
            .map(|b| bits(&device, b).iter().map(|x| f64::from_bits(*x).powi(2)).sum::<f64>())
            .sum();
        let got = Tensor::from_buffer(sum, Shape::new([1]), &device)
            .to_device(&cpu)
            .unwrap()
            .item()
            .unwrap();
        assert!(
            ((got - want) / want).abs() < 1e-5,
            "{dtype}: sum of squares {got}, the CPU's {want}"
        );

        let factor = backend.from_host(&HostVec::F32(vec![0.37])).unwrap();
        let before = support::launches(&device);
        let scaled = backend.scaled_copies(&refs, &factor).unwrap();
        let scale_launches = support::launches(&device) - before;
        let narrow = backend.cast(&factor, &Layout::contiguous([1]), dtype).unwrap();
        for (g, s) in grads.iter().zip(&scaled) {
            let whole = Layout::contiguous([g.len()]);
            let broadcast = Layout::contiguous([1])
                .broadcast_to("test", &Shape::new([g.len()]))
                .unwrap();
            let want = backend.binary(BinaryOp::Mul, g, &whole, &narrow, &broadcast).unwrap();
            assert_eq!(bits(&device, s), bits(&device, &want), "{dtype}: scaled_copies");
        }
        println!(
            "{dtype}: multi-tensor launches: adam_steps {adam_launches}, sum_of_squares {sum_launches}, scaled_copies \
             {scale_launches} (for {} tensors)",
            LENS.len()
        );
        assert_eq!(
            (adam_launches, sum_launches, scale_launches),
            (1, 2, 1),
            "{dtype}: the multi-tensor kernels did not run (see the start-up check's warning above)"
        );
    }
}

/// Autocast's weight copies: f32 weights of GPT-like lengths to bf16 and f16 in one launch,
/// equal to one `cast` each bit for bit.
#[test]
fn weight_copies_take_one_launch_and_equal_the_casts() {
    let _counting = support::exclusive();
    let Some(device) = support::cuda_device() else { return };
    let backend = device.backend();
    let weights: Vec<BufferRef> = LENS
        .iter()
        .enumerate()
        .map(|(k, &n)| upload(&device, k, n, DType::F32))
        .collect();
    let refs: Vec<&BufferRef> = weights.iter().collect();
    for dtype in [DType::BF16, DType::F16] {
        // The first call of a dtype runs the start-up check: not counted.
        backend.cast_copies(&refs, dtype).unwrap();
        let before = support::launches(&device);
        let copies = backend.cast_copies(&refs, dtype).unwrap();
        assert_eq!(
            support::launches(&device) - before,
            1,
            "{dtype}: see the start-up check's warning above"
        );
        for (w, c) in weights.iter().zip(&copies) {
            let want = backend.cast(w, &Layout::contiguous([w.len()]), dtype).unwrap();
            assert_eq!(bits(&device, c), bits(&device, &want), "{dtype}: cast_copies");
        }
    }
}
