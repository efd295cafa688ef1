//! bf16 rests as 16-bit halves of u32 words. Copies move the halves, and matmul, the unfoldings
//! and elementwise ops read and write them themselves, without f32 copies around them: checked bit for bit (copies) and to bf16's
//! rounding (products) against the CPU, at views that start and end mid-word, and by the
//! dispatches they take.

mod support;

use half::bf16;
use lockstep_core::{Device, Tensor};

/// The same bf16 tensor on `device`: values that fill all 16 bits (signs, small exponents).
fn values(shape: &[usize], salt: u32, device: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<bf16> = (0..n as u32)
        .map(|i| bf16::from_bits((i.wrapping_mul(40503) ^ salt.wrapping_mul(2654435761)) as u16 & 0xbfff))
        .collect();
    Tensor::from_vec(data, shape.to_vec(), device).unwrap()
}

/// A bf16 tensor of values spread over [-1, 1], for products.
fn spread(shape: &[usize], salt: usize, device: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32(((i * 7919 + salt * 104729) % 2001) as f32 / 1000.0 - 1.0))
        .collect();
    Tensor::from_vec(data, shape.to_vec(), device).unwrap()
}

fn bits(t: &Tensor) -> Vec<u16> {
    t.to_vec::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Tensors built by `f` on the CPU and on wgpu, equal bit for bit.
fn same_bits(what: &str, wgpu: &Device, f: impl Fn(&Device) -> Tensor) {
    let cpu = Device::parse("cpu").unwrap();
    let (want, got) = (f(&cpu), f(wgpu));
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(bits(&got), bits(&want), "{what}");
}

#[test]
fn bf16_copies_move_halves_bit_for_bit() {
    let Some(device) = support::wgpu_device() else { return };
    same_bits("transposed, made contiguous", &device, |d| {
        values(&[5, 7], 1, d).t().unwrap().contiguous().unwrap()
    });
    same_bits("a view from an odd offset, read back as it is", &device, |d| {
        values(&[5, 7], 2, d).narrow(1, 1, 5).unwrap()
    });
    same_bits("narrowed at an odd offset", &device, |d| {
        values(&[5, 7], 2, d).narrow(1, 1, 5).unwrap().contiguous().unwrap()
    });
    // Rows of 7 stacked: the second and third start mid-word, where the first and second end.
    same_bits("concatenated along rows", &device, |d| {
        let parts = [values(&[3, 7], 3, d), values(&[2, 7], 4, d), values(&[1, 7], 5, d)];
        Tensor::concat(&[&parts[0], &parts[1], &parts[2]], 0).unwrap()
    });
    // Strided destinations take the f32 route.
    same_bits("concatenated along columns", &device, |d| {
        let parts = [values(&[3, 3], 6, d), values(&[3, 4], 7, d)];
        Tensor::concat(&[&parts[0], &parts[1]], 1).unwrap()
    });
    // One row written in place (a view from an odd offset), between neighbours it must leave alone.
    same_bits("assigned into a row", &device, |d| {
        let dst = values(&[4, 9], 8, d);
        dst.narrow(0, 1, 1).unwrap().assign(&values(&[1, 9], 9, d)).unwrap();
        dst
    });
}

/// Products of bf16 operands from the packed words: within bf16's rounding of the CPU's, in one
/// dispatch where n is even (two columns a word), through f32 copies (four) where it is odd.
#[test]
fn bf16_products_read_and_write_packed_words() {
    let Some((device, _backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let cpu = Device::parse("cpu").unwrap();
    for (m, k, n, dispatches) in [(9, 13, 6, 1), (65, 40, 66, 1), (7, 5, 5, 4)] {
        let product = |d: &Device| {
            let a = spread(&[m, k + 1], 10, d).narrow(1, 1, k).unwrap();
            let b = spread(&[n, k], 11, d).t().unwrap();
            let before = d.backend().work_counters().kernels;
            let out = a.matmul(&b).unwrap();
            let after = d.backend().work_counters().kernels;
            (out, after.zip(before).map(|(a, b)| a - b))
        };
        let ((want, _), (got, dispatched)) = (product(&cpu), product(&device));
        assert_eq!(dispatched, Some(dispatches), "{m}x{k}x{n}: dispatches of one matmul");
        let (want, got) = (want.to_vec::<bf16>().unwrap(), got.to_vec::<bf16>().unwrap());
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let (w, g) = (w.to_f32(), g.to_f32());
            assert!(
                (w - g).abs() <= 1e-2 * w.abs().max(1.0),
                "{m}x{k}x{n}, element {i}: {g} vs the CPU's {w}"
            );
        }
    }
}

/// A bf16 convolution with batch norm, a relu and elementwise ops after it, forward and backward,
/// takes the dispatches an f32 one does: its products (implicit GEMM), copies, normalisation and
/// elementwise ops read and write the packed words, with no f32 copy around any of them (every product here has an even
/// n: the weight gradient's is 2 channels x 3 x 3).
#[test]
fn a_bf16_convolution_takes_no_f32_copies() {
    use lockstep_core::{Conv2dOptions, DType};
    let Some((device, _backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let dispatches = |dtype: DType| {
        let x = spread(&[2, 2, 6, 6], 12, &device)
            .to_dtype(dtype)
            .unwrap()
            .requires_grad(true);
        let w = spread(&[4, 2, 3, 3], 13, &device)
            .to_dtype(dtype)
            .unwrap()
            .requires_grad(true);
        let seed = spread(&[2, 4, 6, 6], 14, &device).to_dtype(dtype).unwrap();
        let before = device.backend().work_counters().kernels.unwrap();
        let options = Conv2dOptions {
            padding: [1, 1],
            ..Conv2dOptions::default()
        };
        let (running_mean, running_var) = (
            Tensor::zeros([4], DType::F32, &device).unwrap(),
            Tensor::ones([4], DType::F32, &device).unwrap(),
        );
        let gamma = spread(&[4], 15, &device)
            .to_dtype(DType::F32)
            .unwrap()
            .requires_grad(true);
        let beta = spread(&[4], 16, &device)
            .to_dtype(DType::F32)
            .unwrap()
            .requires_grad(true);
        let y = x.conv2d(&w, None, options).unwrap();
        let y = y
            .batch_norm(&running_mean, &running_var, Some(&gamma), Some(&beta), true, 0.1, 1e-5)
            .unwrap()
            .relu()
            .unwrap();
        y.add(&y.mul(&y).unwrap()).unwrap().backward_with(seed).unwrap();
        let taken = device.backend().work_counters().kernels.unwrap() - before;
        assert!(x.grad().is_some() && w.grad().is_some() && gamma.grad().is_some());
        taken
    };
    let (f32_dispatches, bf16_dispatches) = (dispatches(DType::F32), dispatches(DType::BF16));
    assert!(
        f32_dispatches >= 5,
        "the convolution, batch norm and their gradients: {f32_dispatches}"
    );
    assert_eq!(
        bf16_dispatches, f32_dispatches,
        "dispatches of a bf16 convolution against f32's"
    );
}

/// Reductions of bf16 read the packed words: the f32 reduction of the same values, in the same
/// order, rounded once, in one dispatch more than f32's (that rounding of the outputs) and with no
/// f32 copy of the source — the tokens of a bias gradient, from a view at an odd offset.
#[test]
fn bf16_reductions_read_packed_words() {
    let Some((device, _backend)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let dispatched = |f: &dyn Fn() -> Tensor| {
        let before = device.backend().work_counters().kernels.unwrap();
        let out = f();
        (out, device.backend().work_counters().kernels.unwrap() - before)
    };
    type Reduction = fn(&Tensor) -> Tensor;
    let cases: [(&str, [usize; 2], Reduction); 5] = [
        ("column sums", [600, 70], |t| t.sum(&[0], false).unwrap()),
        ("row sums", [70, 600], |t| t.sum(&[1], false).unwrap()),
        ("the sum of all", [33, 17], |t| t.sum_all().unwrap()),
        ("row maxima", [9, 40], |t| t.max(1, false).unwrap()),
        ("column minima", [40, 9], |t| t.min(0, false).unwrap()),
    ];
    for (what, [rows, cols], reduce) in cases {
        let narrow = spread(&[rows, cols + 1], 17, &device).narrow(1, 1, cols).unwrap();
        let wide = narrow.to_dtype(lockstep_core::DType::F32).unwrap();
        let (from_bf16, bf16_dispatches) = dispatched(&|| reduce(&narrow));
        let (from_f32, f32_dispatches) = dispatched(&|| reduce(&wide));
        let rounded = from_f32.to_dtype(lockstep_core::DType::BF16).unwrap();
        assert_eq!(bits(&from_bf16), bits(&rounded), "{what}");
        assert_eq!(bf16_dispatches, f32_dispatches + 1, "{what}: dispatches against f32's");
    }
    let argmax = |t: &Tensor| t.argmax(1, false).unwrap().to_vec::<u32>().unwrap();
    let narrow = spread(&[9, 41], 18, &device).narrow(1, 1, 40).unwrap();
    let wide = narrow.to_dtype(lockstep_core::DType::F32).unwrap();
    assert_eq!(argmax(&narrow), argmax(&wide), "argmax");
}
