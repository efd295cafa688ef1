use super::*;
use crate::device::Device;
use crate::rng::Generator;

fn weight() -> Tensor {
    Tensor::rand_normal([4, 3], 0.0, 1.0, DType::F32, &Generator::new(0), &Device::cpu())
        .unwrap()
        .requires_grad(true)
}

#[test]
fn products_run_low_and_losses_run_full() {
    let w = weight();
    let x = Tensor::rand_normal([2, 4], 0.0, 1.0, DType::F32, &Generator::new(1), &Device::cpu()).unwrap();
    let (y, loss) = autocast(DType::BF16, || {
        let y = x.matmul(&w)?;
        let loss = y.log_softmax(-1)?.sum_all()?;
        Ok((y, loss))
    })
    .unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(loss.dtype(), DType::F32);
    loss.backward().unwrap();
    // Master weights stay f32, and so do their gradients.
    assert_eq!(w.grad().unwrap().dtype(), DType::F32);
    assert_eq!(active(), None, "the region ended with the guard");
}

#[test]
fn a_weight_is_cast_once_per_region() {
    let w = weight();
    autocast(DType::F16, || {
        let a = lower(&w)?;
        let b = lower(&w)?;
        assert!(a.same_storage(&b), "the second use reused the first cast");
        Ok(())
    })
    .unwrap();
    let outside = lower(&w).unwrap();
    assert_eq!(outside.dtype(), DType::F32, "no cast outside a region");
}

#[test]
fn mixed_operands_promote_only_under_autocast() {
    let a = Tensor::full([2], 1.0, DType::F32, &Device::cpu()).unwrap();
    let b = Tensor::full([2], 2.0, DType::BF16, &Device::cpu()).unwrap();
    assert!(a.add(&b).is_err(), "outside autocast, mixed dtypes are an error");
    let sum = autocast(DType::BF16, || a.add(&b)).unwrap();
    assert_eq!(sum.dtype(), DType::F32);
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
}

#[test]
fn only_half_types_are_autocast_targets() {
    assert!(AutocastGuard::new(DType::F32).is_err());
}

#[test]
fn batch_norm_keeps_its_input_dtype_and_computes_in_f32() {
    // As PyTorch's autocast: batch norm is on neither list, so a bf16 activation stays bf16.
    let device = Device::cpu();
    let x = Tensor::rand_normal([4, 3, 5, 5], 0.5, 2.0, DType::F32, &Generator::new(2), &device).unwrap();
    let weight = Tensor::rand_normal([3], 1.0, 0.1, DType::F32, &Generator::new(3), &device)
        .unwrap()
        .requires_grad(true);
    let bias = Tensor::zeros([3], DType::F32, &device).unwrap();
    let stats = || {
        (
            Tensor::zeros([3], DType::F32, &device).unwrap(),
            Tensor::ones([3], DType::F32, &device).unwrap(),
        )
    };
    let low = x.to_dtype(DType::BF16).unwrap().requires_grad(true);
    // A weighted sum: a plain sum of a batch norm's output has a zero input gradient.
    let r = Tensor::rand_normal([4, 3, 5, 5], 0.0, 1.0, DType::F32, &Generator::new(4), &device).unwrap();
    let input_grad = |y: &Tensor| {
        low.zero_grad();
        y.to_dtype(DType::F32)
            .unwrap()
            .mul(&r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        low.grad()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    for training in [true, false] {
        let (mean, var) = stats();
        let y = autocast(DType::BF16, || {
            low.batch_norm(&mean, &var, Some(&weight), Some(&bias), training, 0.1, 1e-5)
        })
        .unwrap();
        assert_eq!(y.dtype(), DType::BF16, "training={training}");
        assert_eq!(mean.dtype(), DType::F32, "the running statistics stay f32");
        // The f32 computation on the same (bf16-rounded) input, rounded once at the end.
        let (mean, var) = stats();
        let full = low
            .to_dtype(DType::F32)
            .unwrap()
            .batch_norm(&mean, &var, Some(&weight), Some(&bias), training, 0.1, 1e-5)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(values(&y), values(&full), "training={training}");
        if training {
            // The input's gradient, likewise the f32 computation's rounded once.
            assert_eq!(input_grad(&y), input_grad(&full));
            assert_eq!(weight.grad().unwrap().dtype(), DType::F32);
        }
    }
}

/// Prefetching casts ahead the parameters the last prefetching region lowered (one
/// `cast_copies` per device) into the cache the forward pass reads, and changes no result: the
/// same loss and gradient bits as casts made one at a time. A parameter the last region did not
/// lower, a frozen weight and an f64 one are left alone.
#[test]
fn prefetched_weights_give_the_same_results_and_are_reused() {
    let frozen = Tensor::rand_normal([3, 3], 0.0, 1.0, DType::F32, &Generator::new(5), &Device::cpu()).unwrap();
    let wide = weight().to_dtype(DType::F64).unwrap().detach().requires_grad(true);
    let unused = weight();
    let x = Tensor::rand_normal([2, 4], 0.0, 1.0, DType::F32, &Generator::new(1), &Device::cpu()).unwrap();
    let (w1, w2) = (
        weight(),
        weight()
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .detach()
            .requires_grad(true),
    );
    let params = [
        w1.clone(),
        w2.clone(),
        w1.clone(),
        frozen.clone(),
        wide.clone(),
        unused.clone(),
    ];
    let cached = || REGION.with(|r| r.borrow().as_ref().unwrap().cache.len());
    let step = |prefetched: bool, expect_cached: usize| {
        let loss = autocast(DType::BF16, || {
            if prefetched {
                prefetch(&params)?;
                assert_eq!(cached(), expect_cached);
                assert!(lower(&w1)?.same_storage(&lower(&w1)?));
            }
            x.matmul(&w1)?.matmul(&frozen)?.matmul(&w2)?.log_softmax(-1)?.sum_all()
        })
        .unwrap();
        for w in [&w1, &w2] {
            w.zero_grad();
        }
        loss.backward().unwrap();
        let bits = |t: &Tensor| {
            t.grad()
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        (loss.item().unwrap().to_bits(), bits(&w1), bits(&w2))
    };
    let one_by_one = step(false, 0);
    // The first prefetching region has nothing learnt (this thread's regions above did not
    // learn): it casts as it goes, and learns w1 and w2; the next casts those two ahead.
    assert_eq!(step(true, 0), one_by_one);
    assert_eq!(step(true, 2), one_by_one);
    // Outside a region it does nothing.
    prefetch(&[weight()]).unwrap();
}

/// The bits of `t`'s values, any float dtype.
fn bits(t: &Tensor) -> Vec<u64> {
    t.to_host().unwrap().to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn the_residual_add_reads_the_branch_as_it_is_with_the_promoted_bits_and_gradients() {
    let cpu = Device::cpu();
    let stream = Tensor::rand_normal([3, 5], 0.0, 1.0, DType::F32, &Generator::new(2), &cpu).unwrap();
    let branch = Tensor::rand_normal([5], 0.0, 1.0, DType::BF16, &Generator::new(3), &cpu).unwrap();
    let upstream = Tensor::rand_normal([3, 5], 0.0, 1.0, DType::F32, &Generator::new(4), &cpu).unwrap();
    let run = |promote_by_hand: bool, subtract: bool| {
        let (a, b) = (stream.detach().requires_grad(true), branch.detach().requires_grad(true));
        let out = autocast(DType::BF16, || {
            let b = if promote_by_hand {
                b.to_dtype(DType::F32)?
            } else {
                b.clone()
            };
            if subtract { b.sub(&a) } else { a.add(&b) }
        })
        .unwrap();
        out.mul(&upstream).unwrap().sum_all().unwrap().backward().unwrap();
        let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
        assert_eq!(
            (out.dtype(), ga.dtype(), gb.dtype()),
            (DType::F32, DType::F32, DType::BF16)
        );
        [bits(&out), bits(&ga), bits(&gb)]
    };
    for subtract in [false, true] {
        assert_eq!(run(false, subtract), run(true, subtract), "subtract: {subtract}");
    }
}

#[test]
fn a_layer_norm_feeding_a_product_comes_out_in_the_region_dtype_with_the_cast_bits() {
    let cpu = Device::cpu();
    let ln = crate::nn::LayerNorm::new(6, &cpu).unwrap();
    let x = Tensor::rand_normal([4, 6], 0.0, 2.0, DType::F32, &Generator::new(5), &cpu).unwrap();
    let upstream = Tensor::rand_normal([4, 6], 0.0, 1.0, DType::BF16, &Generator::new(6), &cpu).unwrap();
    let run = |fused: bool| {
        let x = x.detach().requires_grad(true);
        let y = autocast(DType::BF16, || {
            if fused {
                ln.forward_for_product(&x)
            } else {
                ln.forward(&x)?.to_dtype(DType::BF16)
            }
        })
        .unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        y.mul(&upstream).unwrap().sum_all().unwrap().backward().unwrap();
        let grads = [x.grad().unwrap(), ln.weight.grad().unwrap(), ln.bias.grad().unwrap()];
        ln.weight.zero_grad();
        ln.bias.zero_grad();
        assert!(grads.iter().all(|g| g.dtype() == DType::F32));
        [bits(&y), bits(&grads[0]), bits(&grads[1]), bits(&grads[2])]
    };
    assert_eq!(run(true), run(false));
    // Outside a region it is `forward`; an f64 LayerNorm stays f64 (autocast lowers f32 only).
    assert_eq!(ln.forward_for_product(&x).unwrap().dtype(), DType::F32);
    let x64 = x.to_dtype(DType::F64).unwrap();
    let ln64 = crate::nn::LayerNorm {
        weight: ln.weight.to_dtype(DType::F64).unwrap(),
        bias: ln.bias.to_dtype(DType::F64).unwrap(),
        eps: 1e-5,
    };
    let y = autocast(DType::BF16, || ln64.forward_for_product(&x64)).unwrap();
    assert_eq!(y.dtype(), DType::F64);
}

#[test]
fn layer_norm_to_rounds_to_half_types_only() {
    let x = Tensor::ones([2, 3], DType::F32, &Device::cpu()).unwrap();
    let err = x.layer_norm_to(None, None, 1e-5, DType::U32).unwrap_err().to_string();
    assert!(err.contains("f16 or bf16"), "{err}");
    assert_eq!(
        x.layer_norm_to(None, None, 1e-5, DType::F16).unwrap().dtype(),
        DType::F16
    );
}
