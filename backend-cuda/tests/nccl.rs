//! NCCL with one rank on cuda:0 (a single GPU cannot hold two ranks of one communicator):
//! every collective runs and gives the one-rank answer, and the training reducer works on it;
//! a rank whose peer never joins fails naming it, and collectives are timed on the device.
//! Where there are two devices (the emulator has two), two ranks give the two-rank answers and
//! pass point-to-point messages.

mod support;

use std::time::{Duration, Instant};

use lockstep_core::backend::{Communicator, ReduceOp};
use lockstep_core::{DType, Device, HostVec, Layout};
use lockstep_cuda::{NcclCommunicator, NcclId};

/// `cuda:0` where NCCL loads too, or None after saying loudly why not
/// (`LOCKSTEP_EXPECT_NCCL=1` makes a missing NCCL fail).
fn nccl_device() -> Option<Device> {
    let device = support::cuda_device()?;
    if !lockstep_cuda::probe::nccl_present() {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_NCCL").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_NCCL=1 but NCCL did not load"
        );
        eprintln!("\n*** SKIPPED: NCCL not found (see `lockstep devices`) ***\n");
        return None;
    }
    Some(device)
}

#[test]
fn one_rank_collectives_run_on_nccl() {
    let Some(device) = nccl_device() else { return };
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
    let Some(device) = nccl_device() else { return };
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

/// The join is non-blocking and polled against the timeout: rank 0 of 2 whose rank 1 never
/// comes fails after the timeout, naming rank 1, where ncclCommInitRank waited forever.
#[test]
fn a_rank_whose_peer_never_joins_fails_naming_it() {
    let Some(device) = nccl_device() else { return };
    let timeout = Duration::from_secs(3);
    let started = Instant::now();
    let joined = NcclCommunicator::from_rank_with_timeout(&device, 0, 2, &NcclId::new().unwrap(), timeout);
    let waited = started.elapsed();
    let why = joined.err().expect("rank 1 never joined").to_string();
    assert!(why.contains("timed out after 3s waiting for rank(s) [1]"), "{why}");
    assert!(waited >= timeout, "gave up after {waited:?}");
    assert!(waited < timeout * 10, "the timeout did not fire in time: {waited:?}");
    // The device goes on working after the abandoned join.
    let comm = NcclCommunicator::from_rank(&device, 0, 1, &NcclId::new().unwrap()).unwrap();
    comm.barrier().unwrap();
}

/// Collectives only enqueue, so the host's clock sees about nothing: their time comes from
/// events around them on the communicator's stream.
#[test]
fn collectives_are_timed_on_the_device() {
    let Some(device) = nccl_device() else { return };
    let comm = NcclCommunicator::from_rank(&device, 0, 1, &NcclId::new().unwrap()).unwrap();
    let backend = device.backend();
    let n = 16 << 20;
    let input = backend.full(DType::F32, n, 1.0).unwrap();
    let output = backend.zeros(DType::F32, n).unwrap();
    for _ in 0..4 {
        // One rank: a 64 MiB device-to-device copy, tens of microseconds.
        comm.all_gather(&input, &output).unwrap();
    }
    comm.barrier().unwrap();
    let ran = comm.take_collective_time().unwrap();
    assert!(ran > Duration::ZERO, "four 64 MiB all-gathers took no device time");
    assert!(ran < Duration::from_secs(10), "{ran:?}");
    assert_eq!(comm.take_collective_time().unwrap(), Duration::ZERO, "counted once");
    let back = backend.to_host(&output, &Layout::contiguous([n])).unwrap().to_f64_vec();
    assert!(back.iter().all(|&v| v == 1.0));
}

/// `cuda:0` and `cuda:1` with NCCL, or None after saying why not (a one-GPU machine; the
/// emulator has two devices unless told otherwise).
fn two_nccl_devices() -> Option<[Device; 2]> {
    let first = nccl_device()?;
    match Device::parse("cuda:1") {
        Ok(second) => Some([first, second]),
        Err(e) => {
            eprintln!("\n*** SKIPPED: two ranks need two CUDA devices ({e}) ***\n");
            None
        }
    }
}

/// Rank `rank` of two runs every collective on its own device; the answers are the two-rank
/// ones (rank r holds r + (i mod 64)/4 at element i: exact in bf16, and so are the sums).
fn two_rank_collectives(comm: &NcclCommunicator, device: &Device) {
    let rank = comm.rank();
    let backend = device.backend();
    let n = 300_000; // more than one of the emulator's staging slots
    let values = |r: usize| -> Vec<f64> { (0..n).map(|i| r as f64 + (i % 64) as f64 / 4.0).collect() };
    let (zero, one) = (values(0), values(1));
    let sum: Vec<f64> = zero.iter().zip(&one).map(|(a, b)| a + b).collect();
    let mine = if rank == 0 { &zero } else { &one };
    for dtype in [DType::F32, DType::BF16] {
        let upload = |values: &[f64]| backend.from_host(&HostVec::from_f64(dtype, values)).unwrap();
        let expect = |what: &str, buf: &lockstep_core::backend::BufferRef, want: &[f64]| {
            let got = backend
                .to_host(buf, &Layout::contiguous([want.len()]))
                .unwrap()
                .to_f64_vec();
            let wrong = got.iter().zip(want).position(|(g, w)| g != w);
            assert!(
                wrong.is_none(),
                "{dtype} {what} on rank {rank}: element {wrong:?} is {:?}, not {:?}",
                wrong.map(|i| got[i]),
                wrong.map(|i| want[i])
            );
        };
        let buf = upload(mine);
        comm.all_reduce(&buf, ReduceOp::Sum).unwrap();
        expect("all_reduce sum", &buf, &sum);
        let buf = upload(mine);
        comm.all_reduce(&buf, ReduceOp::Max).unwrap();
        expect("all_reduce max", &buf, &one);
        let buf = upload(mine);
        comm.broadcast(&buf, 1).unwrap();
        expect("broadcast from rank 1", &buf, &one);
        let gathered = upload(&vec![0.0; 2 * n]);
        comm.all_gather(&upload(mine), &gathered).unwrap();
        expect("all_gather", &gathered, &[zero.clone(), one.clone()].concat());
        let part = upload(&vec![0.0; n / 2]);
        comm.reduce_scatter(&upload(mine), &part, ReduceOp::Sum).unwrap();
        expect("reduce_scatter", &part, &sum[rank * n / 2..(rank + 1) * n / 2]);
        // Point to point (ZeRO's checkpoints from processes): 0 sends, 1 answers with its own.
        let other = 1 - rank;
        let theirs = upload(&vec![0.0; n]);
        if rank == 0 {
            comm.send(&upload(mine), other).unwrap();
            comm.recv(&theirs, other).unwrap();
        } else {
            comm.recv(&theirs, other).unwrap();
            comm.send(&upload(mine), other).unwrap();
        }
        expect("recv", &theirs, if rank == 0 { &one } else { &zero });
        assert!(comm.send(&theirs, rank).is_err(), "a rank sends to another rank only");
    }
    comm.barrier().unwrap();
}

/// Two ranks on two devices, made both ways: one process's group (ncclCommInitAll, a thread per
/// rank) and one id joined from two threads (as the launcher's processes join).
#[test]
fn two_ranks_on_two_devices_give_the_two_rank_answers() {
    let Some(devices) = two_nccl_devices() else { return };
    // Each rank's thread owns its communicator: one that panics drops it, and its peer's next
    // call fails instead of waiting out the timeout.
    let group = NcclCommunicator::group(&devices).unwrap();
    std::thread::scope(|s| {
        for (comm, device) in group.into_iter().zip(&devices) {
            s.spawn(move || two_rank_collectives(&comm, device));
        }
    });
    let id = NcclId::new().unwrap();
    std::thread::scope(|s| {
        for (rank, device) in devices.iter().enumerate() {
            s.spawn(move || {
                let comm = NcclCommunicator::from_rank(device, rank, 2, &id).unwrap();
                two_rank_collectives(&comm, device);
            });
        }
    });
}
