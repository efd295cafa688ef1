//! Shapes past one dispatch's 65535 workgroups in a dimension, on a device with WebGPU's default
//! limits (what every adapter offers), against the CPU: the grid folds into y for elementwise
//! ops, row-wise ops and matmul. And tensors past one buffer binding are refused by name, while
//! those just within it are granted even where their pooled size class would not be.
//! Each shape is the smallest that crosses the limit, with tiny inner sizes: lavapipe is slow.

mod support;

use lockstep_core::{DType, Device, Tensor};

/// Workgroups one grid dimension holds, and the invocations of a 1-D shader's workgroup.
const MAX_GROUPS: usize = 65535;
const WORKGROUP: usize = 256;

fn default_limits_device() -> Option<Device> {
    let (device, backend) = support::private_wgpu_device(wgpu::Limits::default())?;
    let granted = backend.limits();
    assert_eq!(granted.max_buffer_size, wgpu::Limits::default().max_buffer_size);
    assert_eq!(granted.max_compute_workgroups_per_dimension, MAX_GROUPS as u32);
    Some(device)
}

/// Small integers that vary along the tensor, so any misplaced element shows.
fn pattern(len: usize, period: usize) -> Vec<f32> {
    (0..len).map(|i| (i % period) as f32).collect()
}

/// `op` on `inputs` on `device` and on the CPU.
fn on_both(
    device: &Device,
    inputs: &[(Vec<f32>, Vec<usize>)],
    op: impl Fn(&[Tensor]) -> lockstep_core::Result<Tensor>,
) -> (Vec<f32>, Vec<f32>) {
    let run = |on: &Device| {
        let tensors: Vec<Tensor> = inputs
            .iter()
            .map(|(v, shape)| Tensor::from_slice(v, shape.as_slice(), on).unwrap())
            .collect();
        op(&tensors).unwrap().to_vec::<f32>().unwrap()
    };
    (run(device), run(&Device::cpu()))
}

#[test]
fn a_binary_op_past_65535_workgroups_matches_the_cpu() {
    let Some(device) = default_limits_device() else { return };
    let n = MAX_GROUPS * WORKGROUP + 1000;
    // The second operand broadcasts: half the memory of two full ones.
    let inputs = [(pattern(n, 1021), vec![n]), (vec![0.5], vec![1])];
    let (gpu, cpu) = on_both(&device, &inputs, |t| t[0].add(&t[1]));
    let wrong = gpu.iter().zip(&cpu).position(|(g, c)| g != c);
    assert_eq!(wrong, None, "first wrong element of {n}");
}

#[test]
fn a_softmax_over_more_than_65535_rows_matches_the_cpu() {
    let Some(device) = default_limits_device() else { return };
    let (rows, cols) = (MAX_GROUPS + 2, 3);
    let inputs = [(pattern(rows * cols, 11), vec![rows, cols])];
    let (gpu, cpu) = on_both(&device, &inputs, |t| t[0].softmax(-1));
    let wrong = gpu.iter().zip(&cpu).position(|(g, c)| (g - c).abs() > 1e-6);
    assert_eq!(wrong, None, "first wrong element of {rows}x{cols}");
}

#[test]
fn a_matmul_with_more_than_65535_column_blocks_matches_the_cpu() {
    let Some(device) = default_limits_device() else { return };
    // 64 columns per workgroup (TILE in matmul.wgsl): 65537 blocks.
    let (m, k, n) = (2, 3, 64 * MAX_GROUPS + 100);
    let inputs = [(pattern(m * k, 5), vec![m, k]), (pattern(k * n, 13), vec![k, n])];
    let (gpu, cpu) = on_both(&device, &inputs, |t| t[0].matmul(&t[1]));
    let wrong = gpu.iter().zip(&cpu).position(|(g, c)| g != c);
    assert_eq!(wrong, None, "first wrong element of {m}x{n}");
}

#[test]
fn matmul_grids_fold_through_the_batch_on_a_device_with_few_workgroups_per_dimension() {
    // The same folding in small: 8 workgroups per dimension, so a few blocks of 64x64 spill
    // into y, over batches and rows as well as columns.
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 8,
        ..wgpu::Limits::default()
    };
    let Some((device, _)) = support::private_wgpu_device(limits) else {
        return;
    };
    // 3 batches x 2 row blocks x 3 column blocks = 18 blocks as 6x3.
    let (batch, m, k, n) = (3, 70, 5, 150);
    let inputs = [
        (pattern(batch * m * k, 5), vec![batch, m, k]),
        (pattern(batch * k * n, 13), vec![batch, k, n]),
    ];
    let (gpu, cpu) = on_both(&device, &inputs, |t| t[0].matmul(&t[1]));
    assert_eq!(gpu.iter().zip(&cpu).position(|(g, c)| g != c), None, "batched");
    // 2 x 10 blocks = 20 as 7x3: the last workgroup has no block.
    let (m, k, n) = (70, 5, 64 * 9 + 5);
    let inputs = [(pattern(m * k, 5), vec![m, k]), (pattern(k * n, 13), vec![k, n])];
    let (gpu, cpu) = on_both(&device, &inputs, |t| t[0].matmul(&t[1]));
    assert_eq!(
        gpu.iter().zip(&cpu).position(|(g, c)| g != c),
        None,
        "one idle workgroup"
    );
}

#[test]
fn the_naive_matmul_with_more_than_65535_blocks_matches_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    // 16 columns per workgroup: 65537 blocks.
    let (m, k, n) = (1, 2, 16 * MAX_GROUPS + 20);
    let a = pattern(m * k, 5);
    let b = pattern(k * n, 13);
    let gpu = lockstep_wgpu::matmul_naive(
        &Tensor::from_slice(&a, [m, k], &device).unwrap(),
        &Tensor::from_slice(&b, [k, n], &device).unwrap(),
    )
    .unwrap()
    .to_vec::<f32>()
    .unwrap();
    let cpu = Tensor::from_slice(&a, [m, k], &Device::cpu())
        .unwrap()
        .matmul(&Tensor::from_slice(&b, [k, n], &Device::cpu()).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let wrong = gpu.iter().zip(&cpu).position(|(g, c)| g != c);
    assert_eq!(wrong, None, "first wrong element of {m}x{n}");
}

#[test]
fn a_tensor_past_the_binding_limit_is_refused_and_one_within_it_is_granted() {
    // A limit just above 1 MiB, where a request's size class (1.25 MiB) passes it.
    let limit = (1 << 20) + 64;
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: limit,
        ..wgpu::Limits::default()
    };
    let Some((device, _)) = support::private_wgpu_device(limits) else {
        return;
    };
    let before = device.backend().memory_stats().allocated_bytes;

    let within = Tensor::full([limit as usize / 4], 1.5, DType::F32, &device).expect("a tensor at the limit");
    let doubled = within.add(&within).unwrap().to_vec::<f32>().unwrap();
    assert!(doubled.iter().all(|&v| v == 3.0));
    drop(within);

    let err = Tensor::zeros([limit as usize / 4 + 1], DType::F32, &device).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("max_storage_buffer_binding_size") && msg.contains(device.location()),
        "{msg}"
    );
    assert_eq!(device.backend().memory_stats().allocated_bytes, before);
}
