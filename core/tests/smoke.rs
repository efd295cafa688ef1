use lockstep_core::{DType, Device, Tensor};

#[test]
fn matmul_and_backward_match_hand_computation() {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &dev)
        .unwrap()
        .requires_grad(true);
    let b = Tensor::from_vec(vec![1f32, 0., 0., 1., 1., 1.], [3, 2], &dev)
        .unwrap()
        .requires_grad(true);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![4., 5., 10., 11.]);
    c.sum_all().unwrap().backward().unwrap();
    // d sum(a@b) / da = ones @ b^T : each row is the row sums of b.
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), vec![1., 1., 2., 1., 1., 2.]);
    assert_eq!(b.grad().unwrap().to_vec::<f32>().unwrap(), vec![5., 5., 7., 7., 9., 9.]);
    let t = a.t().unwrap().matmul(&a).unwrap();
    assert_eq!(t.dims(), &[3, 3]);
    assert_eq!(t.to_vec::<f32>().unwrap()[0], 17.);
    let x = Tensor::arange(0, 6, DType::F32, &dev).unwrap().reshape([2, 3]).unwrap();
    let s = x
        .softmax(-1)
        .unwrap()
        .sum(&[-1], false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert!(s.iter().all(|v| (v - 1.0).abs() < 1e-6));
}

#[test]
fn leaves_never_share_a_gradient_buffer() {
    let dev = Device::cpu();
    let a = Tensor::from_vec(vec![1f32, 2.], [2], &dev).unwrap().requires_grad(true);
    let b = Tensor::from_vec(vec![3f32, 4.], [2], &dev).unwrap().requires_grad(true);
    a.add(&b).unwrap().sum_all().unwrap().backward().unwrap();
    let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
    assert!(
        !ga.same_storage(&gb),
        "an in-place write to one gradient would change the other"
    );
    assert_eq!(ga.to_vec::<f32>().unwrap(), gb.to_vec::<f32>().unwrap());
}
