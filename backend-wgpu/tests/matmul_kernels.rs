//! Each block product of matmul.wgsl, forced (`matmul_with`), against the CPU: all four
//! transposes, own and broadcast batches, odd m, n and k, a split k and an empty one, in f32, bf16
//! and (where the adapter has it) f16. And the kernels against each other, bit for bit: each
//! output sums its k in the same order in all of them.

mod support;

use lockstep_core::{DType, Device, Shape, Tensor};
use lockstep_wgpu::{MatmulKernel, matmul_with};

/// Small integers (-3..=3) in no pattern a misplaced index could keep: every product here sums
/// exactly in f32, so a kernel matches the CPU to the bit whatever order either adds in.
fn integers(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97) >> 7) % 7) as f32 - 3.0)
        .collect()
}

/// Values with full mantissas, for comparing the kernels' rounding with each other.
fn reals(len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * 31 + seed * 7) as f32 * 0.618).sin()).collect()
}

/// How one operand of `[batch, rows, cols]` is laid out.
#[derive(Clone, Copy, Debug)]
enum Batch {
    /// A matrix (2-D).
    None,
    /// `n` matrices of its own.
    Own(usize),
    /// One matrix seen `n` times (batch stride 0).
    Broadcast(usize),
}

/// A `rows x cols` operand (per batch) of `dtype` on `device`, stored transposed where
/// `transposed` (so its rows are the contiguous axis), from `values`.
fn operand(
    values: fn(usize, usize) -> Vec<f32>,
    seed: usize,
    (rows, cols): (usize, usize),
    transposed: bool,
    batch: Batch,
    dtype: DType,
    device: &Device,
) -> Tensor {
    let stored = |count: Option<usize>| {
        let (len, dims) = match (count, transposed) {
            (None, false) => (rows * cols, vec![rows, cols]),
            (None, true) => (rows * cols, vec![cols, rows]),
            (Some(n), false) => (n * rows * cols, vec![n, rows, cols]),
            (Some(n), true) => (n * rows * cols, vec![n, cols, rows]),
        };
        let t = Tensor::from_slice(&values(len, seed), dims, device)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        if transposed { t.transpose(-2, -1).unwrap() } else { t }
    };
    match batch {
        Batch::None => stored(None),
        Batch::Own(n) => stored(Some(n)),
        Batch::Broadcast(n) => stored(Some(1)).broadcast_as(&Shape::new([n, rows, cols])).unwrap(),
    }
}

/// One product to check: `[m, k] @ [k, n]` per batch.
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    transposed: (bool, bool),
    batches: (Batch, Batch),
    dtype: DType,
}

impl Case {
    /// The operands on `device`.
    fn operands(&self, values: fn(usize, usize) -> Vec<f32>, device: &Device) -> (Tensor, Tensor) {
        let a = operand(
            values,
            1,
            (self.m, self.k),
            self.transposed.0,
            self.batches.0,
            self.dtype,
            device,
        );
        let b = operand(
            values,
            2,
            (self.k, self.n),
            self.transposed.1,
            self.batches.1,
            self.dtype,
            device,
        );
        (a, b)
    }

    /// The product with `kernel` on `device`, as f32.
    fn on(&self, device: &Device, kernel: MatmulKernel, values: fn(usize, usize) -> Vec<f32>) -> Vec<f32> {
        let (a, b) = self.operands(values, device);
        let out = matmul_with(&a, &b, kernel).unwrap_or_else(|e| panic!("{self:?} with {kernel:?}: {e}"));
        out.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
    }

    /// The CPU's product, as f32.
    fn on_cpu(&self, values: fn(usize, usize) -> Vec<f32>) -> Vec<f32> {
        let (a, b) = self.operands(values, &Device::cpu());
        a.matmul(&b)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    }
}

/// The element types the adapter runs: f32, bf16, and f16 where it has SHADER_F16.
fn dtypes() -> Vec<DType> {
    let mut dtypes = vec![DType::F32, DType::BF16];
    if lockstep_wgpu::adapter(0).is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16)) {
        dtypes.push(DType::F16);
    }
    dtypes
}

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Every kernel's product of `case` in every transpose and element type, against the CPU's.
fn check_against_cpu(device: &Device, m: usize, k: usize, n: usize, batches: (Batch, Batch)) {
    for dtype in dtypes() {
        for transposed in TRANSPOSES {
            let case = Case {
                m,
                k,
                n,
                transposed,
                batches,
                dtype,
            };
            let want = case.on_cpu(integers);
            for kernel in MatmulKernel::ALL {
                let got = case.on(device, kernel, integers);
                assert_eq!(got.len(), want.len(), "{case:?} with {kernel:?}");
                if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
                    panic!(
                        "{case:?} with {kernel:?}: element {i} is {}, the CPU's {}",
                        got[i], want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_cpu_on_odd_shapes_in_every_transpose() {
    let Some(device) = support::wgpu_device() else { return };
    let matrices = (Batch::None, Batch::None);
    // Below one k step, one row or column, blocks cut short on every side, and k past 16 steps
    // of 8 with a remainder; 130 x 258 spans 3 x 3 blocks of 128.
    for (m, k, n) in [
        (1, 1, 1),
        (3, 17, 1),
        (17, 3, 129),
        (129, 257, 3),
        (257, 129, 17),
        (130, 40, 258),
    ] {
        check_against_cpu(&device, m, k, n, matrices);
    }
}

#[test]
fn every_kernel_matches_the_cpu_on_own_and_broadcast_batches() {
    let Some(device) = support::wgpu_device() else { return };
    for batches in [
        (Batch::Own(3), Batch::Own(3)),
        (Batch::Broadcast(3), Batch::Own(3)),
        (Batch::Own(2), Batch::Broadcast(2)),
    ] {
        check_against_cpu(&device, 17, 33, 129, batches);
        check_against_cpu(&device, 130, 9, 3, batches);
    }
}

#[test]
fn every_kernel_matches_the_cpu_on_a_split_k() {
    let Some(device) = support::wgpu_device() else { return };
    // 2 x 1 blocks of 64 and k past 2048: summed in 2 splits (ops/matmul.rs, split_k_chunk); an
    // odd n, which bf16 still writes packed through the split's flat sum.
    check_against_cpu(&device, 65, 2100, 33, (Batch::None, Batch::None));
    check_against_cpu(&device, 3, 2051, 130, (Batch::Own(2), Batch::Broadcast(2)));
}

#[test]
fn every_kernel_writes_zeros_for_an_empty_k() {
    let Some(device) = support::wgpu_device() else { return };
    for dtype in dtypes() {
        let a = Tensor::zeros([5, 0], dtype, &device).unwrap();
        let b = Tensor::zeros([0, 7], dtype, &device).unwrap();
        for kernel in MatmulKernel::ALL {
            let out = matmul_with(&a, &b, kernel).unwrap();
            let got = out.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, vec![0.0; 35], "{dtype:?} with {kernel:?}");
        }
    }
}

#[test]
fn the_kernels_agree_to_the_bit() {
    let Some(device) = support::wgpu_device() else { return };
    for dtype in dtypes() {
        for transposed in TRANSPOSES {
            for (m, k, n) in [(129, 257, 130), (65, 2100, 33)] {
                let case = Case {
                    m,
                    k,
                    n,
                    transposed,
                    batches: (Batch::None, Batch::None),
                    dtype,
                };
                let outputs: Vec<Vec<u32>> = MatmulKernel::ALL
                    .into_iter()
                    .map(|kernel| case.on(&device, kernel, reals).iter().map(|v| v.to_bits()).collect())
                    .collect();
                for (kernel, out) in MatmulKernel::ALL.iter().zip(&outputs).skip(1) {
                    assert!(out == &outputs[0], "{case:?}: {kernel:?} differs from auto");
                }
            }
        }
    }
}
