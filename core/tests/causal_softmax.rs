//! Attention's weights fused into one pass each way (`Tensor::causal_softmax` on the CPU) against
//! the ops they replace: the same bits in f32, forward and backward, with and without dropout
//! and with a row that holds a NaN; the same stream position afterwards; and bf16 close to f32.

use lockstep_core::{DType, Device, Generator, Tensor};

/// `[2, 3, t, t]` scores from a fixed stream, with gradient tracking.
fn scores(t: usize, dtype: DType) -> Tensor {
    let generator = Generator::new(3);
    let x = Tensor::rand_normal([2, 3, t, t], 0.0, 2.5, DType::F32, &generator, &Device::cpu()).unwrap();
    x.to_dtype(dtype).unwrap().requires_grad(true)
}

/// The weights as `causal_attention` composed them before the fused op: scale, masked fill,
/// softmax, dropout.
fn composed(x: &Tensor, scale: f64, dropout: Option<(f64, &Generator)>) -> Tensor {
    let t = x.dims()[3];
    let positions = Tensor::arange(0, t as i64, DType::F32, x.device()).unwrap();
    let future = positions
        .reshape([1, t])
        .unwrap()
        .gt(&positions.reshape([t, 1]).unwrap())
        .unwrap();
    let masked = x
        .mul_scalar(scale)
        .unwrap()
        .masked_fill(&future, f64::NEG_INFINITY)
        .unwrap();
    let weights = masked.softmax(-1).unwrap();
    match dropout {
        Some((p, generator)) => weights.dropout(p, true, generator).unwrap(),
        None => weights,
    }
}

/// The weights and the scores' gradient for a fixed upstream gradient, as f32 bits.
fn run(x: &Tensor, weights: impl Fn(&Tensor) -> Tensor) -> (Vec<u32>, Vec<u32>) {
    let w = weights(x);
    let upstream = Tensor::rand_normal(w.dims().to_vec(), 0.0, 1.0, DType::F32, &Generator::new(9), w.device())
        .unwrap()
        .to_dtype(w.dtype())
        .unwrap();
    w.mul(&upstream).unwrap().sum_all().unwrap().backward().unwrap();
    let bits = |t: &Tensor| {
        let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        v.iter().map(|f| f.to_bits()).collect()
    };
    (bits(&w), bits(&x.grad().expect("no gradient reached the scores")))
}

#[test]
fn fused_weights_and_gradients_are_the_composed_ops_bits_in_f32() {
    for (t, p) in [(13, None), (13, Some(0.2)), (64, Some(0.5)), (1, Some(0.3))] {
        let (fused_stream, composed_stream) = (Generator::new(21), Generator::new(21));
        let fused = run(&scores(t, DType::F32), |x| {
            x.causal_softmax(0.125, p.map(|p| (p, &fused_stream))).unwrap()
        });
        let reference = run(&scores(t, DType::F32), |x| {
            composed(x, 0.125, p.map(|p| (p, &composed_stream)))
        });
        assert_eq!(fused.0, reference.0, "weights, t {t}, dropout {p:?}");
        assert_eq!(fused.1, reference.1, "gradient, t {t}, dropout {p:?}");
        assert_eq!(fused_stream.state(), composed_stream.state(), "stream position, t {t}");
        if p.is_some() && t > 1 {
            let dropped = fused.0.iter().filter(|&&b| b == 0).count();
            assert!(dropped > 2 * 3 * t * (t - 1) / 2, "dropout dropped nothing (t {t})");
        }
    }
}

#[test]
fn a_row_that_sees_a_nan_is_nan_and_a_nan_in_the_future_is_masked() {
    let t = 4;
    let mut values = vec![0.5f32; t * t];
    values[2 * t + 1] = f32::NAN; // row 2 sees key 1
    values[t + 3] = f32::NAN; // row 1 does not see key 3
    let make = || {
        Tensor::from_vec(values.clone(), [1, 1, t, t], &Device::cpu())
            .unwrap()
            .requires_grad(true)
    };
    let fused = run(&make(), |x| x.causal_softmax(0.5, None).unwrap());
    let reference = run(&make(), |x| composed(x, 0.5, None));
    assert_eq!(fused, reference);
    let weights: Vec<f32> = fused.0.iter().map(|&b| f32::from_bits(b)).collect();
    assert!(weights[2 * t..3 * t].iter().all(|w| w.is_nan()), "{weights:?}");
    assert_eq!(&weights[t..2 * t], &[0.5, 0.5, 0.0, 0.0]);
}

#[test]
fn bf16_weights_stay_bf16_and_close_to_f32() {
    let t = 32;
    let wide = run(&scores(t, DType::F32), |x| {
        x.causal_softmax(0.125, Some((0.1, &Generator::new(4)))).unwrap()
    });
    let narrow_scores = scores(t, DType::BF16);
    let weights = narrow_scores
        .causal_softmax(0.125, Some((0.1, &Generator::new(4))))
        .unwrap();
    assert_eq!(weights.dtype(), DType::BF16);
    let narrow = run(&scores(t, DType::BF16), |x| {
        x.causal_softmax(0.125, Some((0.1, &Generator::new(4)))).unwrap()
    });
    for (what, (a, b)) in [("weights", (&wide.0, &narrow.0)), ("gradient", (&wide.1, &narrow.1))] {
        let worst = a
            .iter()
            .zip(b)
            .map(|(&a, &b)| (f32::from_bits(a) - f32::from_bits(b)).abs())
            .fold(0.0f32, f32::max);
        // bf16 keeps 8 bits: the scores' rounding moves a weight by about 1% of the largest.
        assert!(worst < 0.05, "{what}: bf16 differs from f32 by {worst}");
    }
}
