//! The reducer's mechanics on two CPU virtual devices: buckets are rebuilt once in the order
//! gradients arrive, all-reduces run on a communication thread while backward goes on, and
//! buffers (running statistics) follow rank 0's.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use lockstep_core::backend::{BufferRef, Communicator, ReduceOp};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::nn::{BatchNorm1d, Linear, Module, ModuleExt, Sequential};
use lockstep_core::{DType, Device, Generator, Result, Tensor};

mod parallel_support;
use parallel_support::{Intercepted, on_cpu_ranks, on_fresh_cpu_ranks};

/// Runs `body(rank, device, comm)` on two threads, one per CPU virtual device.
fn on_two_ranks<T: Send + 'static>(
    body: impl Fn(usize, Device, Arc<dyn Communicator>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    on_cpu_ranks(2, move |device, comm| body(comm.rank(), device, Arc::new(comm)))
}

/// Three parameters of 64 bytes, used in forward in the order p1, p0, p2: backward finishes p2
/// first, then p0, then p1, unlike reverse registration order (p2, p1, p0).
fn three_params(device: &Device) -> Vec<Tensor> {
    (0..3)
        .map(|i| {
            Tensor::full([16], 1.0 + i as f64, DType::F32, device)
                .unwrap()
                .requires_grad(true)
        })
        .collect()
}

fn forward_backward(p: &[Tensor], x: &Tensor) {
    let h = x.mul(&p[1]).unwrap().mul(&p[0]).unwrap().mul(&p[2]).unwrap();
    h.sum_all().unwrap().backward().unwrap();
}

/// One parameter per bucket, so the bucket order shows the parameter order.
const ONE_EACH: ReducerConfig = ReducerConfig {
    first_bucket_bytes: 64,
    bucket_bytes: 64,
};

#[test]
fn buckets_are_rebuilt_once_in_the_order_gradients_arrived() {
    let orders = on_two_ranks(|rank, device, comm| {
        let p = three_params(&device);
        let reducer = Reducer::new(&p, comm, ONE_EACH).unwrap();
        let before = reducer.buckets();
        let x = Tensor::full([16], 1.0 + rank as f64, DType::F32, &device).unwrap();
        let mut after = Vec::new();
        for _ in 0..2 {
            forward_backward(&p, &x);
            reducer.finish().unwrap();
            after.push(reducer.buckets());
            p.iter().for_each(Tensor::zero_grad);
        }
        (before, after)
    });
    for (before, after) in orders {
        assert_eq!(
            before,
            vec![vec![2], vec![1], vec![0]],
            "reverse registration order at first"
        );
        assert_eq!(
            after[0],
            vec![vec![2], vec![0], vec![1]],
            "arrival order after the first step"
        );
        assert_eq!(after[1], after[0], "rebuilt once, then kept");
    }
}

#[test]
fn the_first_bucket_is_reduced_while_backward_is_still_running() {
    let results = on_two_ranks(|rank, device, comm| {
        // Holds the first all-reduce until backward has reached its last gradient: if
        // all-reduces ran on the backward thread, backward could never get there and the wait
        // would time out.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (held, held_once) = (gate.clone(), Mutex::new(false));
        let comm = Arc::new(Intercepted {
            inner: comm,
            before_all_reduce: Box::new(move || {
                if std::mem::replace(&mut *held_once.lock().unwrap(), true) {
                    return;
                }
                let (lock, wake) = &*held;
                let (open, timeout) = wake
                    .wait_timeout_while(lock.lock().unwrap(), Duration::from_secs(10), |open| !*open)
                    .unwrap();
                assert!(
                    *open && !timeout.timed_out(),
                    "backward never reached its last gradient while the first bucket was being reduced"
                );
            }),
        });
        let p = three_params(&device);
        let reducer = Reducer::new(&p, comm, ONE_EACH).unwrap();
        // p1 is the last gradient of backward (see `three_params`).
        p[1].add_grad_ready_hook(Arc::new(move |_| {
            *gate.0.lock().unwrap() = true;
            gate.1.notify_all();
            Ok(())
        }));
        let x = Tensor::full([16], 1.0 + rank as f64, DType::F32, &device).unwrap();
        forward_backward(&p, &x);
        reducer.finish().unwrap();
        let times = reducer.last_comm_times();
        (p[2].grad().unwrap().to_vec::<f32>().unwrap(), times)
    });
    // d/dp2 of sum(x * p1 * p0 * p2) = x * p1 * p0 = x * 2, averaged over x = 1 and x = 2.
    for (grad, times) in results {
        assert!(grad.iter().all(|&g| g == 3.0), "{grad:?}");
        assert_eq!(times.buckets, 3);
        assert!(
            times.all_reduce > 0.0 && times.hidden() <= times.all_reduce,
            "{times:?}"
        );
    }
}

fn bn_model(device: &Device) -> Sequential {
    let g = Generator::new(4);
    Sequential::new()
        .add(Linear::new(6, 5, true, device, &g).unwrap())
        .add(BatchNorm1d::new(5, device).unwrap())
}

#[test]
fn buffers_start_as_rank_zeros_and_stay_equal_to_them() {
    let results = on_two_ranks(|rank, device, comm| {
        let model = bn_model(&device);
        let buffers = || -> Vec<Vec<f32>> {
            let named = model.named_buffers();
            let floats = named.iter().filter(|(_, b)| b.dtype() == DType::F32);
            floats.map(|(_, b)| b.to_vec::<f32>().unwrap()).collect()
        };
        // Rank 1's running statistics start elsewhere; rank 0's must win.
        if rank == 1 {
            model.named_buffers()[0]
                .1
                .assign(&Tensor::full([5], 7.0, DType::F32, &device).unwrap())
                .unwrap();
        }
        let reducer = Reducer::for_model(&model, comm, ReducerConfig::default()).unwrap();
        let at_start = buffers();
        // Each rank normalises its own, different batch; rank 0's statistics are kept.
        let x = Tensor::rand_normal(
            [8, 6],
            rank as f64,
            1.0,
            DType::F32,
            &Generator::new(rank as u64),
            &device,
        )
        .unwrap();
        model.forward(&x).unwrap().sum_all().unwrap().backward().unwrap();
        reducer.finish().unwrap();
        (at_start, buffers())
    });
    assert_eq!(results[0].0, results[1].0, "buffers broadcast at construction");
    assert!(results[0].0[0].iter().all(|&m| m == 0.0), "{:?}", results[0].0);
    assert_eq!(results[0].1, results[1].1, "buffers broadcast after the step");
    assert_ne!(results[0].1, results[0].0, "the step updated the running statistics");
}

/// A communicator whose calls only queue their collectives (as NCCL's do) and that reports
/// their device time: 7 s whenever asked.
struct DeviceTimed(Arc<dyn Communicator>);

impl Communicator for DeviceTimed {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn all_reduce(&self, buf: &BufferRef, op: ReduceOp) -> Result<()> {
        self.0.all_reduce(buf, op)
    }
    fn broadcast(&self, buf: &BufferRef, root: usize) -> Result<()> {
        self.0.broadcast(buf, root)
    }
    fn all_gather(&self, input: &BufferRef, output: &BufferRef) -> Result<()> {
        self.0.all_gather(input, output)
    }
    fn reduce_scatter(&self, input: &BufferRef, output: &BufferRef, op: ReduceOp) -> Result<()> {
        self.0.reduce_scatter(input, output, op)
    }
    fn barrier(&self) -> Result<()> {
        self.0.barrier()
    }
    fn take_device_time(&self) -> Result<Option<Duration>> {
        Ok(Some(Duration::from_secs(7)))
    }
}

#[test]
fn a_communicator_that_times_its_collectives_on_the_device_is_believed() {
    let results = on_two_ranks(|rank, device, comm| {
        let p = three_params(&device);
        let reducer = Reducer::new(&p, Arc::new(DeviceTimed(comm)), ONE_EACH).unwrap();
        let x = Tensor::full([16], 1.0 + rank as f64, DType::F32, &device).unwrap();
        forward_backward(&p, &x);
        reducer.finish().unwrap();
        reducer.last_comm_times()
    });
    for times in results {
        // The host timed enqueues of microseconds; the device's 7 s is what is reported.
        assert_eq!(times.all_reduce, 7.0, "{times:?}");
    }
}

/// Parameter i of `three_params` belongs to rank `OWNERS[i]` under ZeRO stage 2.
const OWNERS: [usize; 3] = [0, 1, 0];

#[test]
fn sharded_gradients_reach_their_owner_alone_with_data_parallels_bits() {
    let results = on_fresh_cpu_ranks(2, |device, comm| {
        let rank = comm.rank();
        let comm: Arc<dyn Communicator> = Arc::new(comm);
        let x = Tensor::full([16], 1.0 + rank as f64, DType::F32, &device).unwrap();
        let plain = three_params(&device);
        let reducer = Reducer::new(&plain, comm.clone(), ONE_EACH).unwrap();
        forward_backward(&plain, &x);
        reducer.finish().unwrap();
        let sharded = three_params(&device);
        let in_use = || device.backend().memory_stats().allocated_bytes;
        let before = in_use();
        let zero = Reducer::new(&sharded, comm, ONE_EACH).unwrap();
        zero.shard_gradients(OWNERS.to_vec()).unwrap();
        let mut grown = Vec::new();
        for _ in 0..2 {
            forward_backward(&sharded, &x);
            zero.finish().unwrap();
            grown.push(in_use() - before);
            let grads: Vec<Option<Vec<f32>>> = sharded.iter().map(|p| p.grad().map(|g| g.to_vec().unwrap())).collect();
            for (i, g) in grads.iter().enumerate() {
                if OWNERS[i] == rank {
                    assert_eq!(
                        g.as_ref(),
                        Some(&plain[i].grad().unwrap().to_vec::<f32>().unwrap()),
                        "parameter {i}"
                    );
                } else {
                    assert!(g.is_none(), "rank {rank} keeps no gradient of parameter {i}");
                }
            }
            sharded.iter().for_each(Tensor::zero_grad);
        }
        (zero.buckets(), grown)
    });
    for (rank, (buckets, grown)) in results.iter().enumerate() {
        for b in buckets {
            assert!(
                b.iter().all(|&i| OWNERS[i] == OWNERS[b[0]]),
                "one owner a bucket: {buckets:?}"
            );
        }
        // After the step a rank holds its own averaged gradients (64 bytes each) and nothing
        // else: no bucket, no copy of the other rank's gradients.
        let owned = OWNERS.iter().filter(|&&o| o == rank).count() as u64 * 64;
        assert_eq!(grown, &vec![owned; 2], "rank {rank}");
    }
}
