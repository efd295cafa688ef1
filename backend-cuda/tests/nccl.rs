//! NCCL with one rank on cuda:0 (a single GPU cannot hold two ranks of one communicator):
//! every collective runs and gives the one-rank answer, and the training reducer works on it.

mod support;

use lockstep_core::backend::{Communicator, ReduceOp};
use lockstep_core::{DType, HostVec, Layout};
use lockstep_cuda::{NcclCommunicator, NcclId};

#[test]
fn one_rank_collectives_run_on_nccl() {
    let Some(device) = support::cuda_device() else { return };
    if !lockstep_cuda::probe::nccl_present() {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_NCCL").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_NCCL=1 but NCCL did not load"
        );
        eprintln!("\n*** SKIPPED: NCCL not found (see `lockstep devices`) ***\n");
        return;
    }
    let id = NcclId::new().unwrap();
    let id = NcclId::from_bytes(&id.to_bytes()).unwrap();
    let comm = NcclCommunicator::from_rank(&device, 0, 1, &id).unwrap();
    let backend = device.backend();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let values: Vec<f64> = (0..1000).map(|i| i as f64 * 0.5).collect();
        let buf = backend.from_host(&HostVec::from_f64(dtype, &values)).unwrap();
        comm.all_reduce(&buf, ReduceOp::Sum).unwrap();
        comm.all_reduce(&buf, ReduceOp::Mean).unwrap();
        comm.broadcast(&buf, 0).unwrap();
        let out = backend.from_host(&HostVec::from_f64(dtype, &vec![0.0; 1000])).unwrap();
        comm.all_gather(&buf, &out).unwrap();
        comm.reduce_scatter(&buf, &out, ReduceOp::Max).unwrap();
        comm.barrier().unwrap();
        let back = backend.to_host(&out, &Layout::contiguous([1000])).unwrap().to_f64_vec();
        let expected = HostVec::from_f64(dtype, &values).to_f64_vec();
        assert_eq!(back, expected, "{dtype}");
    }
    assert!(
        comm.broadcast(&backend.zeros(DType::F32, 4).unwrap(), 1).is_err(),
        "root 1 of 1 rank"
    );
}

/// The gradients' communicator (on the communication thread) and SyncBatchNorm's (on the
/// training thread) run collectives at once: each communicator has its own stream, so their
/// NCCL kernels are never ordered by a thread race (a cyclic wait across ranks). One GPU holds
/// only one-rank communicators, so this checks they run side by side; the deadlock itself needs
/// two GPUs (scripts/gpu/verify.sh runs this binary).
#[test]
fn two_communicators_on_one_device_run_from_two_threads_at_once() {
    let Some(device) = support::cuda_device() else { return };
    if !lockstep_cuda::probe::nccl_present() {
        assert!(std::env::var("LOCKSTEP_EXPECT_NCCL").as_deref() != Ok("1"));
        eprintln!("\n*** SKIPPED: NCCL not found ***\n");
        return;
    }
    let comms: Vec<NcclCommunicator> = (0..2)
        .map(|_| NcclCommunicator::from_rank(&device, 0, 1, &NcclId::new().unwrap()).unwrap())
        .collect();
    std::thread::scope(|s| {
        for comm in &comms {
            let device = device.clone();
            s.spawn(move || {
                let backend = device.backend();
                let buf = backend.from_host(&HostVec::from_f64(DType::F32, &[1.0; 4096])).unwrap();
                for _ in 0..50 {
                    comm.all_reduce(&buf, ReduceOp::Sum).unwrap();
                }
                comm.barrier().unwrap();
                let back = backend.to_host(&buf, &Layout::contiguous([4096])).unwrap().to_f64_vec();
                assert!(back.iter().all(|&v| v == 1.0));
            });
        }
    });
}
