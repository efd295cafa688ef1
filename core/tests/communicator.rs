//! `LocalCommunicator` over four virtual CPU devices, one thread per rank: every collective's
//! result against values computed here, and failures (a missing rank, a departed rank,
//! mismatched calls) that end in errors naming the problem instead of hanging.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lockstep_core::backend::{Backend, BufferRef, Communicator, LocalCommunicator, ReduceOp};
use lockstep_core::{DType, Device, HostVec, Layout};

const WORLD: usize = 4;

fn backends(first: usize) -> Vec<Arc<dyn Backend>> {
    (first..first + WORLD)
        .map(|r| Device::parse(&format!("cpu:{r}")).unwrap().backend().clone())
        .collect()
}

fn buffer(b: &Arc<dyn Backend>, dtype: DType, values: &[f64]) -> BufferRef {
    b.from_host(&HostVec::from_f64(dtype, values)).unwrap()
}

fn read(b: &Arc<dyn Backend>, buf: &BufferRef) -> Vec<f64> {
    b.to_host(buf, &Layout::contiguous([buf.len()])).unwrap().to_f64_vec()
}

/// Rank r's contribution: element i is (r + 1) * (i + 1) - 2r, distinct per rank and element.
fn contribution(rank: usize, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| ((rank + 1) * (i + 1)) as f64 - 2.0 * rank as f64)
        .collect()
}

/// Runs `f(rank, communicator, backend)` on one thread per rank and returns the results in rank order.
fn on_every_rank<T: Send>(
    comms: Vec<LocalCommunicator>,
    backends: &[Arc<dyn Backend>],
    f: impl Fn(usize, &LocalCommunicator, &Arc<dyn Backend>) -> T + Sync,
) -> Vec<T> {
    thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(backends)
            .map(|(c, b)| {
                let f = &f;
                s.spawn(move || f(c.rank(), &c, b))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn collectives_compute_the_right_values_on_every_rank() {
    let backends = backends(0);
    let comms = LocalCommunicator::group(backends.clone());
    assert_eq!(
        comms.iter().map(|c| (c.rank(), c.world_size())).collect::<Vec<_>>(),
        (0..WORLD).map(|r| (r, WORLD)).collect::<Vec<_>>()
    );
    let len = 7;
    let all: Vec<Vec<f64>> = (0..WORLD).map(|r| contribution(r, len)).collect();
    let column = |i: usize| all.iter().map(move |v| v[i]);
    let sum: Vec<f64> = (0..len).map(|i| column(i).sum()).collect();
    let mean: Vec<f64> = sum.iter().map(|s| s / WORLD as f64).collect();
    let max: Vec<f64> = (0..len).map(|i| column(i).fold(f64::MIN, f64::max)).collect();
    let results = on_every_rank(comms, &backends, |rank, c, b| {
        let mine = contribution(rank, len);
        let mut out = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let buf = buffer(b, DType::F32, &mine);
            c.all_reduce(&buf, op).unwrap();
            out.push(read(b, &buf));
        }
        // Broadcast from rank 2 overwrites everyone else's buffer.
        let buf = buffer(b, DType::F32, &mine);
        c.broadcast(&buf, 2).unwrap();
        out.push(read(b, &buf));
        // All-gather: every rank's input, in rank order.
        let gathered = b.zeros(DType::F32, len * WORLD).unwrap();
        c.all_gather(&buffer(b, DType::F32, &mine), &gathered).unwrap();
        out.push(read(b, &gathered));
        // Reduce-scatter: rank r keeps chunk r of the sum of inputs of WORLD chunks.
        let input: Vec<f64> = (0..WORLD * 2).map(|i| (rank * 10 + i) as f64).collect();
        let chunk = b.zeros(DType::F32, 2).unwrap();
        c.reduce_scatter(&buffer(b, DType::F32, &input), &chunk, ReduceOp::Sum)
            .unwrap();
        out.push(read(b, &chunk));
        c.barrier().unwrap();
        // Reduce to rank 1: it alone ends with the sum, all-reduce's bits.
        let buf = buffer(b, DType::F32, &mine);
        c.reduce(&buf, 1, ReduceOp::Sum).unwrap();
        out.push(if rank == 1 { read(b, &buf) } else { Vec::new() });
        // f16 buffers reduce too (in f64, rounded once).
        let half = buffer(b, DType::F16, &[0.5 * rank as f64, 1.0]);
        c.all_reduce(&half, ReduceOp::Sum).unwrap();
        out.push(read(b, &half));
        out
    });
    for (rank, r) in results.iter().enumerate() {
        assert_eq!(r[0], sum, "all_reduce sum on rank {rank}");
        assert_eq!(r[1], mean, "all_reduce mean on rank {rank}");
        assert_eq!(r[2], max, "all_reduce max on rank {rank}");
        assert_eq!(r[3], all[2], "broadcast on rank {rank}");
        assert_eq!(r[4], all.concat(), "all_gather on rank {rank}");
        let expected: Vec<f64> = (0..2)
            .map(|j| (0..WORLD).map(|q| (q * 10 + rank * 2 + j) as f64).sum())
            .collect();
        assert_eq!(r[5], expected, "reduce_scatter on rank {rank}");
        if rank == 1 {
            assert_eq!(r[6], sum, "reduce to rank 1");
        }
        assert_eq!(
            r[7],
            vec![0.5 * (0..WORLD).sum::<usize>() as f64, WORLD as f64],
            "f16 all_reduce on rank {rank}"
        );
    }
}

#[test]
fn a_missing_rank_times_out_with_its_number() {
    let backends = backends(8);
    let mut comms = LocalCommunicator::group_with_timeout(backends.clone(), Duration::from_millis(200));
    // Rank 3 stays alive but never calls the barrier.
    let absent = comms.pop().unwrap();
    let start = Instant::now();
    let errors = on_every_rank(comms, &backends[..3], |_, c, _| c.barrier().unwrap_err().to_string());
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    // The first rank to give up times out; the others may see it leave first. All name rank 3.
    assert!(errors.iter().any(|e| e.contains("timed out")), "{errors:?}");
    for e in &errors {
        assert!(e.contains("barrier") && e.contains("[3]"), "{e}");
    }
    drop(absent);
}

#[test]
fn a_departed_rank_makes_the_others_fail_instead_of_hanging() {
    let backends = backends(12);
    // A long timeout: the test passes only if departure is noticed without waiting for it.
    let mut comms = LocalCommunicator::group_with_timeout(backends.clone(), Duration::from_secs(60));
    let leaver = comms.pop().unwrap();
    let start = Instant::now();
    let errors = thread::scope(|s| {
        let waiting = s.spawn(|| {
            on_every_rank(comms, &backends[..3], |_, c, b| {
                let buf = buffer(b, DType::F32, &[1.0, 2.0]);
                c.all_reduce(&buf, ReduceOp::Sum).unwrap_err().to_string()
            })
        });
        // Let the others block in the collective first, then leave.
        thread::sleep(Duration::from_millis(50));
        drop(leaver);
        waiting.join().unwrap()
    });
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    for e in &errors {
        assert!(
            e.contains("all_reduce") && e.contains("rank 3") && e.contains("left"),
            "{e}"
        );
    }
}

#[test]
fn mismatched_calls_are_errors() {
    // Different collectives at the same step.
    let backends = backends(16);
    let comms = LocalCommunicator::group_with_timeout(backends[..2].to_vec(), Duration::from_millis(300));
    let errors = on_every_rank(comms, &backends[..2], |rank, c, b| {
        let buf = buffer(b, DType::F32, &[1.0]);
        let r = if rank == 0 {
            c.barrier()
        } else {
            thread::sleep(Duration::from_millis(30));
            c.all_reduce(&buf, ReduceOp::Sum)
        };
        r.unwrap_err().to_string()
    });
    assert!(errors[1].contains("same collectives"), "{}", errors[1]);
    // Rank 1 returned with its error and left: rank 0 learns that instead of waiting it out.
    assert!(
        errors[0].contains("timed out") || errors[0].contains("rank 1 has left"),
        "{}",
        errors[0]
    );
    // Different lengths and dtypes in one all_reduce; a bad root; a wrong all_gather output size.
    let comms = LocalCommunicator::group_with_timeout(backends[..2].to_vec(), Duration::from_secs(10));
    let errors = on_every_rank(comms, &backends[..2], |rank, c, b| {
        let len = if rank == 0 { 3 } else { 4 };
        let lengths = c
            .all_reduce(&buffer(b, DType::F32, &vec![1.0; len]), ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        let root = c.broadcast(&buffer(b, DType::F32, &[1.0]), 5).unwrap_err().to_string();
        let reduce_root = c
            .reduce(&buffer(b, DType::F32, &[1.0]), 2, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(
            reduce_root.contains("reduce") && reduce_root.contains('2'),
            "{reduce_root}"
        );
        let gather = c
            .all_gather(&buffer(b, DType::F32, &[1.0]), &b.zeros(DType::F32, 3).unwrap())
            .unwrap_err()
            .to_string();
        let scatter = c
            .reduce_scatter(
                &buffer(b, DType::F32, &[1.0; 3]),
                &b.zeros(DType::F32, 2).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap_err()
            .to_string();
        (lengths, root, gather, scatter)
    });
    for (lengths, root, gather, scatter) in &errors {
        assert!(
            lengths.contains("all_reduce") && lengths.contains("elements"),
            "{lengths}"
        );
        assert!(root.contains("broadcast") && root.contains('5'), "{root}");
        assert!(gather.contains("all_gather"), "{gather}");
        assert!(scatter.contains("reduce_scatter"), "{scatter}");
    }
    let comms = LocalCommunicator::group_with_timeout(backends[..2].to_vec(), Duration::from_millis(500));
    let errors = on_every_rank(comms, &backends[..2], |rank, c, b| {
        let dtype = if rank == 0 { DType::F32 } else { DType::F16 };
        if rank == 1 {
            thread::sleep(Duration::from_millis(30));
        }
        c.all_reduce(&buffer(b, dtype, &[1.0]), ReduceOp::Sum)
            .unwrap_err()
            .to_string()
    });
    assert!(errors[1].contains("f16") && errors[1].contains("f32"), "{}", errors[1]);
}

#[test]
fn point_to_point_messages_arrive_in_order_between_each_pair() {
    let backends = backends(20);
    let comms = LocalCommunicator::group(backends.clone());
    // Each rank sends three messages to the next (a ring), then receives three from the one
    // before: sends are buffered, so nobody waits for a receiver.
    let got = on_every_rank(comms, &backends, |rank, c, b| {
        let next = (rank + 1) % WORLD;
        for k in 0..3 {
            let msg = buffer(b, DType::F32, &[rank as f64, k as f64]);
            c.send(&msg, next).unwrap();
        }
        let prev = (rank + WORLD - 1) % WORLD;
        (0..3)
            .map(|_| {
                let into = buffer(b, DType::F32, &[0.0, 0.0]);
                c.recv(&into, prev).unwrap();
                read(b, &into)
            })
            .collect::<Vec<_>>()
    });
    for (rank, messages) in got.iter().enumerate() {
        let prev = ((rank + WORLD - 1) % WORLD) as f64;
        assert_eq!(
            messages,
            &[vec![prev, 0.0], vec![prev, 1.0], vec![prev, 2.0]],
            "rank {rank}"
        );
    }
}

#[test]
fn point_to_point_mistakes_are_named_instead_of_hanging() {
    let backends = backends(24);
    let comms = LocalCommunicator::group_with_timeout(backends.clone(), Duration::from_millis(200));
    let errors = on_every_rank(comms, &backends, |rank, c, b| {
        let two = buffer(b, DType::F32, &[1.0, 2.0]);
        match rank {
            // A message of another length than the receiver's buffer.
            0 => c.send(&two, 1).map(|()| String::new()).unwrap(),
            1 => {
                let three = buffer(b, DType::F32, &[0.0; 3]);
                c.recv(&three, 0).unwrap_err().to_string()
            }
            // Rank 3 leaves without sending; and names a rank outside the group.
            2 => c.recv(&two, 3).unwrap_err().to_string(),
            _ => c.send(&two, 9).unwrap_err().to_string(),
        }
    });
    assert!(
        errors[1].contains("rank 0 sent 2 f32 elements, this buffer holds 3 f32"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].contains("rank 3 has left the group without sending"),
        "{}",
        errors[2]
    );
    assert!(errors[3].contains("rank 9 is not another rank"), "{}", errors[3]);

    // A sender that stays but never sends: the receiver gives up after the timeout.
    let others = self::backends(28);
    let comms = LocalCommunicator::group_with_timeout(others.clone(), Duration::from_millis(200));
    let start = Instant::now();
    let errors = on_every_rank(comms, &others, |rank, c, b| match rank {
        0 => c.recv(&buffer(b, DType::F32, &[0.0]), 1).unwrap_err().to_string(),
        1 => {
            std::thread::sleep(Duration::from_millis(600));
            String::new()
        }
        _ => String::new(),
    });
    assert!(errors[0].contains("nothing came from rank 1"), "{}", errors[0]);
    assert!(start.elapsed() < Duration::from_secs(5));
}
