//! What the parity tests share with scripts/parity_hash.py: counter-hashed values both sides
//! compute (so no weights are committed), and reading the fixtures PyTorch wrote.

use safetensors::SafeTensors;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `n` values in [-1, 1), exact in f32: the top 24 bits of splitmix(stream << 32 | i).
pub fn uniform(stream: u64, n: usize) -> Vec<f64> {
    (0..n as u64)
        .map(|i| (splitmix(i | (stream << 32)) >> 40) as f64 / (1u64 << 23) as f64 - 1.0)
        .collect()
}

/// The bytes of a fixture under testdata/.
pub fn fixture(relative: &str) -> Vec<u8> {
    let path = format!("{}/../testdata/{relative}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// An f32 tensor of a fixture, flattened.
pub fn f32s(file: &SafeTensors, name: &str) -> Vec<f32> {
    file.tensor(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Fails unless every loss is within `tolerance` of PyTorch's, relative.
pub fn assert_losses_match(what: &str, ours: &[f64], theirs: &[f32], tolerance: f64) {
    assert_eq!(ours.len(), theirs.len(), "{what}: steps");
    let mut worst = 0.0f64;
    for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let rel = (a - *b as f64).abs() / (*b as f64).abs();
        worst = worst.max(rel);
        assert!(
            rel < tolerance,
            "{what} step {step}: loss {a} against PyTorch's {b} (relative {rel:.2e})\nours {ours:?}\nPyTorch {theirs:?}"
        );
    } // The margin, for whoever changes a kernel's rounding next.
    println!("{what}: largest relative difference from PyTorch {worst:.2e} (tolerance {tolerance:.0e})");
}
