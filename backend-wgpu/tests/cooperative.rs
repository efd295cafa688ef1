//! The cooperative-matrix tier (matmul_coop.wgsl) against the CPU, on an adapter that has one:
//! f16 products in every transpose, with a broadcast batch, partial blocks on every edge and a
//! grid past one row of blocks. Debian 12's lavapipe has no cooperative matrices, so CI also runs
//! this file inside a Debian 13 root with Mesa 26's lavapipe (8x8 f16 matrices) and
//! `LOCKSTEP_EXPECT_COOP=1`, which turns the skip into a failure (.ci/run).

mod support;

use lockstep_core::shape::Shape;
use lockstep_core::{DType, Device, Generator, Tensor};

/// What the opened device says runs its products.
fn products(device: &Device) -> String {
    let info = device.info();
    let line = info.details.iter().find(|(label, _)| label == "matrix products");
    line.map(|(_, v)| v.clone()).unwrap_or_default()
}

fn tier_device() -> Option<Device> {
    let device = support::wgpu_device()?;
    let products = products(&device);
    if products.starts_with("cooperative") {
        return Some(device);
    }
    assert!(
        std::env::var("LOCKSTEP_EXPECT_COOP").as_deref() != Ok("1"),
        "LOCKSTEP_EXPECT_COOP=1 but the products run on: {products}"
    );
    eprintln!("\n*** SKIPPED: no cooperative-matrix tier on wgpu:0 ({products}) ***\n");
    None
}

/// `[batch, rows, cols]` normal f16 values, stored transposed (a permuted view) where `transposed`.
fn operand(dims: [usize; 3], transposed: bool, seed: u64, device: &Device) -> Tensor {
    let [b, r, c] = dims;
    let stored = if transposed { [b, c, r] } else { [b, r, c] };
    let t = Tensor::rand_normal(stored, 0.0, 1.0, DType::F32, &Generator::new(seed), &Device::cpu())
        .and_then(|t| t.to_dtype(DType::F16))
        .and_then(|t| t.to_device(device))
        .unwrap();
    if transposed { t.transpose(1, 2).unwrap() } else { t }
}

#[test]
fn f16_products_on_the_tier_match_the_cpu() {
    let Some(device) = tier_device() else { return };
    // (lhs batch, rhs batch, m, n, k): odd edges, a broadcast rhs, k past a staging round, and
    // more than one row of blocks.
    let shapes = [
        (1, 1, 37, 45, 53),
        (3, 1, 20, 70, 9),
        (2, 2, 130, 33, 100),
        (1, 1, 1, 1, 1),
    ];
    for (i, &(lb, rb, m, n, k)) in shapes.iter().enumerate() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let seed = 2 * i as u64;
            let on = |d: &Device| {
                let a = operand([lb, m, k], ta, seed, d);
                let b = operand([rb, k, n], tb, seed + 1, d);
                let b = if rb < lb {
                    b.broadcast_as(&Shape::new([lb, k, n])).unwrap()
                } else {
                    b
                };
                a.matmul(&b)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
            };
            let (gpu, cpu) = (on(&device), on(&Device::cpu()));
            // Both sum f16 products in f32 and round once to f16; only the order of the sums
            // differs, so an element may land one f16 step (2^-10 relative) away.
            let worst = gpu
                .iter()
                .zip(&cpu)
                .map(|(g, c)| (g - c).abs() / c.abs().max(1.0))
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 2e-3,
                "{lb}x{m}x{k} @ {rb}x{k}x{n} (lhs transposed {ta}, rhs {tb}): worst error {worst}"
            );
        }
    }
}

/// bf16 rows and columns far outside f16's range (1e-12 to 1e12) keep their values on the tier:
/// each is scaled into f16's range on the way in and back on the way out.
#[test]
fn bf16_products_on_the_tier_keep_bf16s_range() {
    let Some(device) = tier_device() else { return };
    assert!(products(&device).contains("bf16 products"), "{}", products(&device));
    let (m, k, n) = (4, 24, 6);
    let row_magnitude = [1e-12f32, 1e-3, 1.0, 1e9];
    let column_magnitude = [1e-9f32, 1e-2, 1.0, 1e4, 1e12, 3e-7];
    let normal = |len: usize, seed: u64| {
        Tensor::rand_normal([len], 0.0, 1.0, DType::F32, &Generator::new(seed), &Device::cpu())
            .and_then(|t| t.to_vec::<f32>())
            .unwrap()
    };
    let lhs: Vec<f32> = normal(m * k, 7)
        .iter()
        .enumerate()
        .map(|(i, v)| v * row_magnitude[i / k])
        .collect();
    let rhs: Vec<f32> = normal(k * n, 8)
        .iter()
        .enumerate()
        .map(|(i, v)| v * column_magnitude[i % n])
        .collect();
    let bf16 = |v: &[f32], dims: [usize; 2]| {
        Tensor::from_vec(v.to_vec(), dims, &Device::cpu())
            .and_then(|t| t.to_dtype(DType::BF16))
            .unwrap()
    };
    let (a, b) = (bf16(&lhs, [m, k]), bf16(&rhs, [k, n]));
    let exact_a = a.to_dtype(DType::F32).and_then(|t| t.to_vec::<f32>()).unwrap();
    let exact_b = b.to_dtype(DType::F32).and_then(|t| t.to_vec::<f32>()).unwrap();
    let got = a
        .to_device(&device)
        .and_then(|a| a.matmul(&b.to_device(&device)?))
        .and_then(|c| c.to_dtype(DType::F32))
        .and_then(|c| c.to_vec::<f32>())
        .unwrap();
    for i in 0..m {
        for j in 0..n {
            let terms = (0..k).map(|p| exact_a[i * k + p] as f64 * exact_b[p * n + j] as f64);
            let (sum, size): (f64, f64) = terms.fold((0.0, 0.0), |(s, z), t| (s + t, z + t.abs()));
            // One bf16 rounding of the sum (2^-9 relative) plus f32 summation, against the sum
            // of the terms' magnitudes, so cancellation cannot inflate it.
            let error = (got[i * n + j] as f64 - sum).abs();
            assert!(
                error <= size * 2f64.powi(-8),
                "[{i}, {j}]: {} for {sum} (terms' magnitudes sum to {size})",
                got[i * n + j]
            );
        }
    }
}

#[test]
fn the_tier_is_named_with_its_shape() {
    let Some(device) = tier_device() else { return };
    let products = products(&device);
    assert!(products.contains("f16->f32"), "{products}");
    assert!(products.contains("x8x8") || products.contains("x16x16"), "{products}");
    // A tile named by LOCKSTEP_WGPU_COOP_TILE is the one that runs (CI runs this file once a tile).
    if let Ok(name) = std::env::var("LOCKSTEP_WGPU_COOP_TILE") {
        let tile = lockstep_wgpu::COOPERATIVE_TILES
            .into_iter()
            .find(|t| t.name == name)
            .expect("a known tile");
        let (g, f) = (tile.grid, tile.frags);
        assert!(products.contains(&format!("{g}x{g} subgroups")), "{products}");
        assert!(products.contains(&format!("with {f}x{f} matrices each")), "{products}");
    }
    // On Vulkan the tier runs our SPIR-V unless told otherwise (LOCKSTEP_WGPU_COOP_SPIRV=wgpu).
    let backend = lockstep_wgpu::backend_of(&device).expect("wgpu:0 is a wgpu backend");
    let vulkan = backend.gpu().info.backend == wgpu::Backend::Vulkan;
    let asked_for_wgpu = std::env::var("LOCKSTEP_WGPU_COOP_SPIRV").as_deref() == Ok("wgpu");
    if vulkan && !asked_for_wgpu {
        assert!(products.contains("our SPIR-V"), "{products}");
    } else {
        assert!(products.contains("wgpu's translation"), "{products}");
    }
}

/// The tier's own SPIR-V (every edge, grid and element type) passes `spirv-val` for Vulkan 1.3.
/// Debian 12's spirv-tools predate cooperative matrices, so CI runs this in the Debian 13 root,
/// where `LOCKSTEP_EXPECT_COOP=1` turns a missing `spirv-val` into a failure.
#[test]
fn our_spirv_passes_the_validator() {
    let version = std::process::Command::new("spirv-val").arg("--version").output();
    let knows_cooperative_matrices = version.is_ok_and(|v| {
        let text = String::from_utf8_lossy(&v.stdout).to_string();
        // `SPIRV-Tools v2025.1 ...`; Debian 12's v2023.1 rejects cooperative matrices.
        let year = text.split(['v', '.']).find_map(|w| w.parse::<u32>().ok());
        year.is_some_and(|y| y >= 2024)
    });
    if !knows_cooperative_matrices {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_COOP").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_COOP=1 but no spirv-val that knows cooperative matrices is on PATH"
        );
        eprintln!("\n*** SKIPPED: no spirv-val from 2024 or later on PATH ***\n");
        return;
    }
    let dir = std::env::temp_dir().join(format!("lockstep-spirv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (edge, subgroup) in [(16u32, 32.0), (8, 8.0)] {
        for tile in lockstep_wgpu::COOPERATIVE_TILES {
            let (grid, frags) = (tile.grid, tile.frags);
            for t in ["f32", "f16", "bf16"] {
                let source = lockstep_shaders::compose_cooperative(edge, grid, frags, &[t]);
                let words = lockstep_wgpu::translate_to_vulkan_spirv(&source, "matmul_coop", &[("SUBGROUP", subgroup)])
                    .unwrap_or_else(|e| panic!("edge {edge} {tile:?} {t}: {e}"));
                let file = dir.join(format!("matmul_coop_{edge}_{}_{t}.spv", tile.name));
                std::fs::write(&file, bytemuck::cast_slice(&words)).unwrap();
                let out = std::process::Command::new("spirv-val")
                    .args(["--target-env", "vulkan1.3"])
                    .arg(&file)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "edge {edge} {tile:?} {t}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
