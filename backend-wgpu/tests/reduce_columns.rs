//! Reductions whose kept elements are one contiguous run (a bias gradient: `[tokens, features]`
//! summed over the tokens) over more than 256 rows take an invocation per column and chunk,
//! neighbours reading neighbouring addresses, then the chunks' fold: two dispatches. Sums equal the CPU's within f32
//! rounding and repeat bit for bit; maxima, minima and argmaxes (first index, NaN first) equal
//! the CPU's exactly.

mod support;

use lockstep_core::backend::ReduceKind;
use lockstep_core::shape::Layout;
use lockstep_core::{Device, HostVec};

fn dispatches(device: &Device) -> u64 {
    device.backend().synchronize().unwrap();
    device.backend().work_counters().kernels.unwrap()
}

#[test]
fn column_reductions_match_the_cpu_in_two_dispatches() {
    let Some(device) = support::wgpu_device() else { return };
    let backend = device.backend();
    let cpu = Device::cpu();
    // (dims, axes): a bias gradient, the same over two leading axes, and columns past a workgroup.
    for (dims, axes) in [
        (vec![600, 70], vec![0]),
        (vec![3, 200, 50], vec![0, 1]),
        (vec![400, 300], vec![0]),
    ] {
        let n: usize = dims.iter().product();
        let mut values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2001) as f32 / 1000.5 - 1.0).collect();
        values[n / 2] = f32::NAN;
        let layout = Layout::contiguous(dims.clone());
        let src = backend.from_host(&HostVec::F32(values.clone())).unwrap();
        let cpu_src = cpu.backend().from_host(&HostVec::F32(values)).unwrap();
        // argmax reduces exactly one axis.
        for kind in ReduceKind::ALL
            .into_iter()
            .filter(|&k| k != ReduceKind::ArgMax || axes.len() == 1)
        {
            let before = dispatches(&device);
            let got = backend.reduce(kind, &src, &layout, &axes).unwrap();
            assert_eq!(dispatches(&device) - before, 2, "{kind:?} over {axes:?} of {dims:?}");
            let again = backend.reduce(kind, &src, &layout, &axes).unwrap();
            let kept = got.len();
            let read = |b| backend.to_host(b, &Layout::contiguous([kept])).unwrap().to_f64_vec();
            let (got, again) = (read(&got), read(&again));
            assert!(
                got.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{kind:?}: not repeatable"
            );
            let on_cpu = cpu.backend().reduce(kind, &cpu_src, &layout, &axes).unwrap();
            let want = cpu
                .backend()
                .to_host(&on_cpu, &Layout::contiguous([kept]))
                .unwrap()
                .to_f64_vec();
            for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                let close = if kind == ReduceKind::Sum {
                    (g - w).abs() <= 1e-3
                } else {
                    g == w
                };
                assert!(
                    close || (g.is_nan() && w.is_nan()),
                    "{kind:?} over {axes:?} of {dims:?}, column {c}: {g} for {w}"
                );
            }
        }
    }
}
