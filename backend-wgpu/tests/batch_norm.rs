//! Training-mode batch norm through the wgpu kernels (batch_norm.wgsl) against the CPU: the
//! output, the running statistics and the three gradients, for an input whose channels are
//! reduced in several chunks and one reduced in one, in f32 and as autocast's bf16 input with f32
//! parameters. On a device with WebGPU's default limits, so the dispatches' bindings fit every
//! adapter.

mod support;

use lockstep_core::{DType, Device, Generator, Tensor};

/// Every result a training step's batch norm gives: y, the running mean and variance, and the
/// gradients of Σ y·r for the input, the weight and the bias (f32 host copies). The input is
/// stored channel-major (as a convolution's product comes) when `channel_major`.
fn batch_norm_results(device: &Device, dims: &[usize], dtype: DType, channel_major: bool) -> Vec<Vec<f32>> {
    let c = dims[1];
    let g = Generator::new(7);
    let host = |shape: &[usize], mean: f64| {
        let t = Tensor::rand_normal(shape.to_vec(), mean, 1.0, DType::F32, &g, &Device::cpu()).unwrap();
        t.to_device(device).unwrap()
    };
    let mut order: Vec<usize> = (0..dims.len()).collect();
    if channel_major {
        order.swap(0, 1);
    }
    let stored: Vec<usize> = order.iter().map(|&a| dims[a]).collect();
    // An offset mean, so a variance from sums of squares would lose digits the kernels keep.
    let leaf = host(&stored, 3.0).to_dtype(dtype).unwrap().requires_grad(true);
    let x = leaf.permute(&order).unwrap();
    let (weight, bias) = (host(&[c], 1.0).requires_grad(true), host(&[c], 0.0).requires_grad(true));
    let r = host(dims, 0.0).to_dtype(dtype).unwrap();
    let (rm, rv) = (
        Tensor::zeros([c], DType::F32, device).unwrap(),
        Tensor::ones([c], DType::F32, device).unwrap(),
    );
    let y = x
        .batch_norm(&rm, &rv, Some(&weight), Some(&bias), true, 0.1, 1e-5)
        .unwrap();
    y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    vec![
        f32s(&y),
        f32s(&rm),
        f32s(&rv),
        f32s(&leaf.grad().expect("the input's gradient")),
        f32s(&weight.grad().expect("the weight's gradient")),
        f32s(&bias.grad().expect("the bias's gradient")),
    ]
}

#[test]
fn batch_norm_on_wgpu_matches_the_cpu_in_chunks_and_whole() {
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let names = ["y", "running mean", "running var", "dx", "dweight", "dbias"];
    // 16384 values a channel: four chunks of 4096 (core's gpu_plan); 14: one.
    // Each also channel-major, read where it lies.
    for (dims, channel_major) in [
        (vec![4, 3, 64, 64], false),
        (vec![2, 5, 7], false),
        (vec![4, 3, 64, 64], true),
        (vec![3, 5, 2, 7], true),
    ] {
        for (dtype, tol) in [(DType::F32, 2e-4), (DType::BF16, 3e-2)] {
            let gpu = batch_norm_results(&device, &dims, dtype, channel_major);
            let cpu = batch_norm_results(&Device::cpu(), &dims, dtype, channel_major);
            for ((name, gpu), cpu) in names.iter().zip(&gpu).zip(&cpu) {
                assert_eq!(gpu.len(), cpu.len(), "{name}");
                // Relative to the result's scale: the gradients' sums run over thousands of terms.
                let scale = cpu.iter().fold(1f32, |m, v| m.max(v.abs()));
                for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
                    assert!(
                        (g - c).abs() <= tol * scale,
                        "{dims:?} {dtype:?} channel-major {channel_major} {name}[{i}]: wgpu {g}, cpu {c} (scale {scale})"
                    );
                }
            }
        }
    }
}

#[test]
fn a_training_batch_norm_takes_the_fused_kernels() {
    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let (weight, bias) = (
        Tensor::ones([3], DType::F32, &device).unwrap(),
        Tensor::zeros([3], DType::F32, &device).unwrap(),
    );
    let (rm, rv) = (
        Tensor::zeros([3], DType::F32, &device).unwrap(),
        Tensor::ones([3], DType::F32, &device).unwrap(),
    );
    let dispatches = || {
        device
            .backend()
            .work_counters()
            .kernels
            .expect("wgpu counts dispatches")
    };
    let image_major = Tensor::full([2, 3, 4, 4], 1.5, DType::F32, &device).unwrap();
    // As a convolution's product comes: nothing is gathered before the kernels.
    let channel_major = Tensor::full([3, 2, 4, 4], 1.5, DType::F32, &device)
        .unwrap()
        .permute(&[1, 0, 2, 3])
        .unwrap();
    for x in [image_major, channel_major] {
        let before = dispatches();
        x.batch_norm(&rm, &rv, Some(&weight), Some(&bias), true, 0.1, 1e-5)
            .unwrap();
        let used = dispatches() - before;
        // The fused kernels take 3 and the running statistics' update 1; composed, it took 21,
        // and the update alone 9.
        assert_eq!(used, 4, "{used} dispatches: the composed path, or a gather first?");
    }
}

/// A layer's bookkeeping on wgpu (one dispatch a batch): after three training batches, its
/// `num_batches_tracked` is exactly 3, an I64 as in PyTorch, and its running statistics are the
/// CPU layer's; evaluation counts nothing.
#[test]
fn a_layer_counts_its_batches_and_keeps_the_cpus_running_statistics() {
    use lockstep_core::nn::{BatchNorm2d, Module};

    let Some((device, _)) = support::private_wgpu_device(wgpu::Limits::default()) else {
        return;
    };
    let buffers = |device: &Device| {
        let mut layer = BatchNorm2d::new(3, device).unwrap();
        let g = Generator::new(11);
        for _ in 0..3 {
            let x = Tensor::rand_normal([2, 3, 4, 4], 1.0, 2.0, DType::F32, &g, &Device::cpu()).unwrap();
            layer.forward(&x.to_device(device).unwrap()).unwrap();
        }
        layer.set_training(false);
        layer
            .forward(&Tensor::ones([2, 3, 4, 4], DType::F32, device).unwrap())
            .unwrap();
        let count = layer
            .num_batches_tracked
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(layer.num_batches_tracked.dtype(), DType::I64);
        let stats = [&layer.running_mean, &layer.running_var].map(|t| t.to_vec::<f32>().unwrap());
        (count, stats)
    };
    let (gpu_count, gpu_stats) = buffers(&device);
    let (cpu_count, cpu_stats) = buffers(&Device::cpu());
    assert_eq!(gpu_count, [3.0]);
    assert_eq!(cpu_count, [3.0]);
    for (gpu, cpu) in gpu_stats.iter().zip(&cpu_stats) {
        for (g, c) in gpu.iter().zip(cpu) {
            assert!((g - c).abs() <= 1e-5 * (1.0 + c.abs()), "wgpu {g}, cpu {c}");
        }
    }
}
