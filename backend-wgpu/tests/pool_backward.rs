//! Max-pool backward is a gather over the windows covering each pixel, not a scan of every
//! window's output for every pixel (which made it cost thousands of forwards: about 1e9 loop
//! iterations for one 256x256 plane, 4.2 s on lavapipe here, and it looked hung at ResNet sizes).

mod support;

use lockstep_core::{DType, Generator, Pool2dOptions, Tensor};

#[test]
fn max_pool_backward_costs_a_few_forwards() {
    let Some(device) = support::wgpu_device() else { return };
    let g = Generator::new(7);
    let x = Tensor::rand_normal([1, 1, 256, 256], 0.0, 1.0, DType::F32, &g, &device)
        .unwrap()
        .requires_grad(true);
    let forward = support::median_seconds(&device, 5, &|| drop(x.max_pool2d(Pool2dOptions::new(2)).unwrap()));
    let both = support::median_seconds(&device, 5, &|| {
        x.max_pool2d(Pool2dOptions::new(2))
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
    });
    let grad = x.grad().unwrap().to_vec::<f32>().unwrap();
    // Every 2x2 window sends its gradient to exactly one pixel (its maximum); the runs add up.
    assert_eq!(grad.iter().filter(|&&v| v != 0.0).count(), 128 * 128);
    eprintln!("max_pool2d 1x1x256x256 on lavapipe: forward + backward {both:.4} s, forward {forward:.4} s");
    // Here: 8.4 ms against a 1.3 ms forward, and that includes the forward itself, the loss's
    // sum and the gradient's accumulation; the bound leaves room for a slower, busier machine.
    assert!(
        both < 15.0 * forward.max(1e-3),
        "forward + backward took {both:.4} s, forward alone {forward:.4} s"
    );
}
