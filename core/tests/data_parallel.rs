//! Two replicas on cpu:0 and cpu:1, each with half of the global batch and gradients averaged
//! by the bucketed reducer, train exactly as one device with the whole batch; the replicas stay
//! identical bit for bit; accumulation steps with no-sync communicate nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lockstep_core::backend::Communicator;
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::nn::{Module, ModuleExt, Sequential};
use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
use lockstep_core::{DType, Device, Generator, Result, Tensor, models};

mod parallel_support;
use parallel_support::{Intercepted, on_cpu_ranks};

const STEPS: usize = 4;
const GLOBAL_BATCH: usize = 32;

fn model(device: &Device) -> Sequential {
    // Same seed on every device: identical initial weights (what a broadcast from rank 0 gives).
    models::mlp(&[24, 24], device, &Generator::new(3)).unwrap()
}

fn data(device: &Device) -> (Tensor, Tensor) {
    let g = Generator::new(11);
    let x = Tensor::rand_normal([GLOBAL_BATCH, 1, 28, 28], 0.0, 1.0, DType::F32, &g, device).unwrap();
    let y = Tensor::from_vec(
        (0..GLOBAL_BATCH as u32).map(|i| (i * 7) % 10).collect::<Vec<_>>(),
        [GLOBAL_BATCH],
        device,
    )
    .unwrap();
    (x, y)
}

fn weights(m: &Sequential) -> Vec<Vec<f32>> {
    m.parameters().iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

fn single_device() -> Vec<Vec<f32>> {
    let device = Device::parse("cpu:0").unwrap();
    let net = model(&device);
    let mut opt = Sgd::new(net.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    let (x, y) = data(&device);
    for _ in 0..STEPS {
        opt.zero_grad();
        net.forward(&x).unwrap().cross_entropy(&y).unwrap().backward().unwrap();
        opt.step().unwrap();
    }
    weights(&net)
}

/// Runs `STEPS` data-parallel steps on cpu:0 and cpu:1 with `micro` micro-batches per step.
fn data_parallel(micro: usize) -> (Vec<Vec<Vec<f32>>>, usize) {
    let counter = Arc::new(AtomicUsize::new(0));
    let counted = counter.clone();
    let replicas = on_cpu_ranks(2, move |device, comm| {
        let rank = comm.rank();
        // Counts all-reduce calls.
        let counter = counted.clone();
        let comm: Arc<dyn Communicator> = Arc::new(Intercepted {
            inner: Arc::new(comm),
            before_all_reduce: Box::new(move || {
                counter.fetch_add(1, Ordering::Relaxed);
            }),
        });
        let net = model(&device);
        // Small buckets so the model spans several of them.
        let config = ReducerConfig {
            first_bucket_bytes: 512,
            bucket_bytes: 2_000,
        };
        let reducer = Reducer::new(&net.parameters(), comm, config).unwrap();
        assert!(reducer.buckets().len() >= 3, "{:?}", reducer.buckets());
        let mut opt = Sgd::new(net.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
        let (x, y) = data(&device);
        let shard = GLOBAL_BATCH / 2;
        let (x, y) = (
            x.narrow(0, rank * shard, shard).unwrap(),
            y.narrow(0, rank * shard, shard).unwrap(),
        );
        let per = shard / micro;
        for _ in 0..STEPS {
            opt.zero_grad();
            for m in 0..micro {
                // Only the last micro-batch synchronises (no_sync before it).
                reducer.set_sync(m + 1 == micro);
                let (xm, ym) = (x.narrow(0, m * per, per).unwrap(), y.narrow(0, m * per, per).unwrap());
                let loss = net.forward(&xm).unwrap().cross_entropy(&ym).unwrap();
                loss.affine(1.0 / micro as f64, 0.0).unwrap().backward().unwrap();
            }
            reducer.finish().unwrap();
            opt.step().unwrap();
        }
        weights(&net)
    });
    (replicas, counter.load(Ordering::Relaxed))
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>]) {
    for (pa, pb) in a.iter().zip(b) {
        for (x, y) in pa.iter().zip(pb) {
            assert!((x - y).abs() <= 1e-5 + 1e-4 * y.abs(), "{x} vs {y}");
        }
    }
}

#[test]
fn two_replicas_with_half_batches_train_as_one_device_with_the_whole_batch() {
    let reference = single_device();
    let (replicas, all_reduces) = data_parallel(1);
    assert_eq!(replicas[0], replicas[1], "replicas must stay identical bit for bit");
    assert_close(&replicas[0], &reference);
    assert_ne!(
        replicas[0],
        weights(&model(&Device::cpu())),
        "training changed the weights"
    );
    // Every bucket is reduced once per step on each of the two ranks.
    assert!(all_reduces >= 2 * STEPS * 3, "{all_reduces}");
}

#[test]
fn accumulation_with_no_sync_reduces_once_per_step_and_matches_the_whole_batch() {
    let reference = single_device();
    let (once, reduces_once) = data_parallel(1);
    let (accumulated, reduces_accumulated) = data_parallel(4);
    assert_eq!(accumulated[0], accumulated[1]);
    assert_close(&accumulated[0], &reference);
    assert_close(&accumulated[0], &once[0]);
    // Four micro-batches per step, yet exactly as much communication as one.
    assert_eq!(reduces_accumulated, reduces_once);
}

#[test]
fn replicas_start_from_rank_zeros_parameters() {
    let r = on_cpu_ranks(2, |device, comm| {
        // Different seeds: without the broadcast the replicas would differ.
        let net = models::mlp(&[16], &device, &Generator::new(100 + comm.rank() as u64)).unwrap();
        let before = weights(&net);
        Reducer::new(&net.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        (before, weights(&net))
    });
    assert_ne!(r[0].0, r[1].0, "the ranks were initialised differently");
    assert_eq!(r[1].1, r[0].0, "rank 1 now holds rank 0's initial parameters");
    assert_eq!(r[0].1, r[0].0, "rank 0 keeps its own");
}

/// Builds the MLP with `hidden` widths on each of two replicas, through `Reducer::for_model`.
fn reducers_for(hidden: [Vec<usize>; 2]) -> Vec<Result<()>> {
    on_cpu_ranks(2, move |device, comm| {
        let net = models::mlp(&hidden[comm.rank()], &device, &Generator::new(0)).unwrap();
        Reducer::for_model(&net, Arc::new(comm), ReducerConfig::default()).map(|_| ())
    })
}

#[test]
fn replicas_of_different_models_are_refused_on_every_rank_naming_the_difference() {
    for r in reducers_for([vec![16], vec![16]]) {
        r.expect("the same model is accepted");
    }
    for (rank, r) in reducers_for([vec![16], vec![24]]).into_iter().enumerate() {
        let err = r.expect_err("a wider hidden layer on rank 1 is refused").to_string();
        assert!(
            err.contains("parameter 0") && err.contains("rank 1"),
            "rank {rank}: {err}"
        );
        assert!(
            err.contains(if rank == 0 { "[16, 784]" } else { "[24, 784]" }),
            "rank {rank}: {err}"
        );
    }
    for r in reducers_for([vec![16], vec![16, 16]]) {
        let err = r.expect_err("an extra layer on rank 1 is refused").to_string();
        assert!(err.contains("rank 1 has 6 parameters and rank 0 has 4"), "{err}");
    }
}
