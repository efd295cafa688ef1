//! Collectives across wgpu devices (and a CPU device) in one process: the core's
//! `LocalCommunicator` stages through host memory, so any mix of adapters agrees.

mod support;

use std::sync::Arc;
use std::thread;

use lockstep_core::backend::{Backend, Communicator, LocalCommunicator, ReduceOp};
use lockstep_core::{DType, Device, HostVec, Layout};

#[test]
fn all_reduce_and_broadcast_across_adapters_agree() {
    let Some(first) = support::wgpu_device() else { return };
    // Every wgpu adapter here (lavapipe's Vulkan and GL faces) plus cpu:5.
    let mut devices = vec![first];
    devices.extend(
        (1..)
            .take_while(|&i| lockstep_wgpu::adapter(i).is_some())
            .map(|i| Device::parse(&format!("wgpu:{i}")).unwrap()),
    );
    devices.push(Device::parse("cpu:5").unwrap());
    let backends: Vec<Arc<dyn Backend>> = devices.iter().map(|d| d.backend().clone()).collect();
    let comms = LocalCommunicator::group(backends.clone());
    let world = comms.len();
    let len = 1000;
    let results: Vec<(Vec<f64>, Vec<f64>)> = thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(&backends)
            .map(|(c, b)| {
                s.spawn(move || {
                    let rank = c.rank();
                    let mine: Vec<f64> = (0..len).map(|i| (rank * len + i) as f64).collect();
                    let buf = b.from_host(&HostVec::from_f64(DType::F32, &mine)).unwrap();
                    c.all_reduce(&buf, ReduceOp::Sum).unwrap();
                    let summed = b.to_host(&buf, &Layout::contiguous([len])).unwrap().to_f64_vec();
                    let root = b.from_host(&HostVec::from_f64(DType::F32, &mine)).unwrap();
                    c.broadcast(&root, world - 1).unwrap();
                    let broadcast = b.to_host(&root, &Layout::contiguous([len])).unwrap().to_f64_vec();
                    (summed, broadcast)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(world >= 2, "only {world} devices");
    for (rank, (summed, broadcast)) in results.iter().enumerate() {
        for i in 0..len {
            let expected: f64 = (0..world).map(|r| (r * len + i) as f64).sum();
            assert_eq!(summed[i], expected, "rank {rank} element {i}");
            assert_eq!(broadcast[i], ((world - 1) * len + i) as f64, "rank {rank} element {i}");
        }
    }
}
