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
