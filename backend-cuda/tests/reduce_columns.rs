//! Reductions whose kept elements are contiguous (a bias gradient: `[tokens, features]` summed
//! over the tokens) on cuda:0 take the column kernel, a thread per column reading neighbouring
//! addresses: at GPT-2's bias-gradient shapes its sums equal the CPU's within f32 rounding,
//! repeat bit for bit, and take two launches (the column pass and the chunks' fold; one for 256
//! rows or fewer). A failed
//! start-up check shows here as the grouped kernel's result, with the check's warning above it.

mod support;

use lockstep_core::backend::ReduceKind;
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec};

#[test]
fn bias_gradient_sums_take_the_column_kernel_and_match_the_cpu() {
    let Some(device) = support::cuda_device() else { return };
    let backend = device.backend();
    for dtype in [DType::F32, DType::BF16] {
        // The first column reduction of a dtype runs the start-up check: not counted below.
        let warm = backend.from_host(&HostVec::from_f64(dtype, &[0.5; 64 * 64])).unwrap();
        backend
            .reduce(ReduceKind::Sum, &warm, &Layout::contiguous([64, 64]), &[0])
            .unwrap();
        for (rows, cols) in [(16 * 1024, 768), (16 * 1024, 3072), (4096, 2304), (37, 50)] {
            let values: Vec<f64> = (0..rows * cols)
                .map(|i| ((i * 7919) % 2001) as f64 / 1000.5 - 1.0)
                .collect();
            let host = HostVec::from_f64(dtype, &values);
            let src = backend.from_host(&host).unwrap();
            let layout = Layout::contiguous([rows, cols]);
            let before = support::launches(&device);
            let sums = backend.reduce(ReduceKind::Sum, &src, &layout, &[0]).unwrap();
            let launched = support::launches(&device) - before;
            let again = backend.reduce(ReduceKind::Sum, &src, &layout, &[0]).unwrap();
            let got = backend
                .to_host(&sums, &Layout::contiguous([cols]))
                .unwrap()
                .to_f64_vec();
            let repeat = backend
                .to_host(&again, &Layout::contiguous([cols]))
                .unwrap()
                .to_f64_vec();
            assert!(
                got.iter().zip(&repeat).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{rows}x{cols} {dtype}: not repeatable"
            );
            let rounded = host.to_f64_vec();
            for c in 0..cols {
                let want: f64 = (0..rows).map(|r| rounded[r * cols + c]).sum();
                let size: f64 = (0..rows).map(|r| rounded[r * cols + c].abs()).sum();
                // f32 sums of `rows` terms, then one rounding to the dtype.
                let tolerance = size * rows as f64 * f64::from(f32::EPSILON) + want.abs() * 2f64.powi(-7);
                assert!(
                    (got[c] - want).abs() <= tolerance,
                    "{rows}x{cols} {dtype} column {c}: {} for {want}",
                    got[c]
                );
            }
            // The column pass and the fold of its chunks; up to 256 rows one pass.
            let expected = if rows > 256 { 2 } else { 1 };
            assert_eq!(launched, expected, "{rows}x{cols} {dtype}: {launched} launches");
        }
    }
}
