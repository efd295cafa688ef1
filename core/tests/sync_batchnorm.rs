//! SyncBatchNorm over replicas on cpu:0 and cpu:1 (threads, in-process collectives) is BatchNorm
//! over the replicas' batches joined on one device: outputs, input and parameter gradients and
//! running statistics, with equal and unequal shards; evaluation never communicates; a world of
//! one is BatchNorm; the model keeps its names; replicas that disagree get an error, not a hang.

use std::sync::{Arc, Mutex};

use lockstep_core::autocast::autocast;
use lockstep_core::backend::{BufferRef, Communicator, LocalCommunicator, ReduceOp};
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::nn::{BatchNorm, BatchNorm1d, BatchNorm2d, Module, ModuleExt};
use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
use lockstep_core::{DType, Device, Error, Generator, Result, Tensor, models};

fn device(rank: usize) -> Device {
    Device::parse(&format!("cpu:{rank}")).unwrap()
}

fn random(shape: &[usize], mean: f64, seed: u64, device: &Device) -> Tensor {
    Tensor::rand_normal(shape.to_vec(), mean, 1.5, DType::F32, &Generator::new(seed), device).unwrap()
}

/// A layer of the given kind whose weight and bias are not the identity (so their gradients
/// and the affine step are exercised); the same values on every device.
fn layer<B: Into<BatchNorm>>(kind: fn(usize, &Device) -> Result<B>, channels: usize, device: &Device) -> BatchNorm {
    let bn: BatchNorm = kind(channels, device).unwrap().into();
    bn.weight
        .as_ref()
        .unwrap()
        .assign(&random(&[channels], 1.0, 1, device))
        .unwrap();
    bn.bias
        .as_ref()
        .unwrap()
        .assign(&random(&[channels], 0.0, 2, device))
        .unwrap();
    bn
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn grad(t: &Tensor) -> Vec<f32> {
    values(&t.grad().expect("a gradient"))
}

/// What one forward and backward step leaves behind.
#[derive(Debug)]
struct Step {
    y: Vec<f32>,
    x_grad: Vec<f32>,
    weight_grad: Vec<f32>,
    bias_grad: Vec<f32>,
    running_mean: Vec<f32>,
    running_var: Vec<f32>,
    batches: i64,
}

/// One training step of `bn` on `x` with the loss `scale * sum(y * r)`: a fixed random
/// weighting, so that every output element gets its own gradient.
fn step(bn: &BatchNorm, x: &Tensor, r: &Tensor, scale: f64) -> Result<Step> {
    let x = x.requires_grad(true);
    let y = bn.forward(&x)?;
    y.mul(r)?.sum_all()?.affine(scale, 0.0)?.backward()?;
    Ok(Step {
        y: values(&y),
        x_grad: grad(&x),
        weight_grad: grad(bn.weight.as_ref().unwrap()),
        bias_grad: grad(bn.bias.as_ref().unwrap()),
        running_mean: values(&bn.running_mean),
        running_var: values(&bn.running_var),
        batches: bn.num_batches_tracked.to_vec::<i64>().unwrap()[0],
    })
}

/// Every element within `tol` of the reference, relative to the reference's largest magnitude.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: {g} vs {w} (scale {scale})");
    }
}

const TOL: f32 = 1e-5;

/// Runs `f(rank, device, communicator)` on a thread per replica, rank r on cpu:r, with one
/// group of communicators; the results in rank order.
fn on_two_replicas<T: Send + 'static>(
    f: impl Fn(usize, Device, Arc<dyn Communicator>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let comms = LocalCommunicator::group((0..2).map(|i| device(i).backend().clone()).collect());
    let threads: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let f = f.clone();
            std::thread::spawn(move || f(rank, device(rank), Arc::new(comm)))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Runs one step of SyncBatchNorm on two replicas, replica r getting rows `shards[r]` of a
/// global batch of `shape`, and compares with BatchNorm on the whole batch on one device.
///
/// Each replica's loss is its local mean weighted by its share, `W * n_r / N` (1 for equal
/// shards, as in plain DDP), so that DDP's average of the replicas' gradients is the gradient
/// of the global mean. As in PyTorch (SBN-3 sums `sum_dy` over replicas), a replica's input
/// gradient is that of the sum of the replicas' losses, W times the global mean's; DDP's 1/W on
/// the layers before brings it back.
fn sync_matches_whole_batch<B: Into<BatchNorm> + 'static>(
    kind: fn(usize, &Device) -> Result<B>,
    shape: &[usize],
    shards: [usize; 2],
) {
    let (n, c) = (shape[0], shape[1]);
    assert_eq!(shards.iter().sum::<usize>(), n);
    let row: usize = shape[1..].iter().product();
    let world = 2.0;

    // The whole batch on one device, loss = the global mean of y * r over rows.
    let one = device(0);
    let x = random(shape, 0.7, 10, &one);
    let r = random(shape, 0.0, 11, &one);
    let reference = step(&layer(kind, c, &one), &x, &r, 1.0 / n as f64).unwrap();

    let (x_host, r_host, shape) = (values(&x), values(&r), shape.to_vec());
    let replicas = on_two_replicas(move |rank, dev, comm| {
        let start = shards[..rank].iter().sum::<usize>() * row;
        let rows = shards[rank];
        let mut local_shape = shape.clone();
        local_shape[0] = rows;
        let local = |v: &[f32]| Tensor::from_slice(&v[start..start + rows * row], local_shape.clone(), &dev).unwrap();
        let mut bn = layer(kind, c, &dev);
        bn.convert_sync_batchnorm(&comm);
        // The local mean (over `rows`) weighted by the share W * rows / N.
        let share = world * rows as f64 / n as f64;
        step(&bn, &local(&x_host), &local(&r_host), share / rows.max(1) as f64).unwrap()
    });

    let joined = |f: fn(&Step) -> &Vec<f32>| replicas.iter().flat_map(|s| f(s).clone()).collect::<Vec<f32>>();
    assert_close("y", &joined(|s| &s.y), &reference.y, TOL);
    let x_grad_of_sum: Vec<f32> = reference.x_grad.iter().map(|g| g * world as f32).collect();
    assert_close("x.grad", &joined(|s| &s.x_grad), &x_grad_of_sum, TOL);
    // DDP: the sum over replicas divided by the world size.
    let ddp_average = |f: fn(&Step) -> &Vec<f32>| -> Vec<f32> {
        (0..c)
            .map(|i| replicas.iter().map(|s| f(s)[i]).sum::<f32>() / world as f32)
            .collect()
    };
    assert_close(
        "weight.grad",
        &ddp_average(|s| &s.weight_grad),
        &reference.weight_grad,
        TOL,
    );
    assert_close("bias.grad", &ddp_average(|s| &s.bias_grad), &reference.bias_grad, TOL);
    for (rank, s) in replicas.iter().enumerate() {
        assert_close(
            &format!("rank {rank} running_mean"),
            &s.running_mean,
            &reference.running_mean,
            TOL,
        );
        assert_close(
            &format!("rank {rank} running_var"),
            &s.running_var,
            &reference.running_var,
            TOL,
        );
        assert_eq!(s.batches, 1);
    }
    // The statistics are all-reduced: every replica keeps the same bits.
    assert_eq!(replicas[0].running_mean, replicas[1].running_mean);
    assert_eq!(replicas[0].running_var, replicas[1].running_var);
}

#[test]
fn sync_batchnorm2d_over_two_half_batches_matches_batchnorm2d_over_the_whole_batch() {
    sync_matches_whole_batch(BatchNorm2d::new, &[8, 3, 4, 5], [4, 4]);
}

#[test]
fn unequal_shards_weigh_as_their_rows() {
    sync_matches_whole_batch(BatchNorm2d::new, &[8, 3, 4, 5], [3, 5]);
}

#[test]
fn sync_batchnorm1d_on_rows_and_on_sequences_matches_batchnorm1d() {
    sync_matches_whole_batch(BatchNorm1d::new, &[10, 6], [4, 6]);
    sync_matches_whole_batch(BatchNorm1d::new, &[6, 4, 7], [3, 3]);
}

#[test]
fn one_value_per_replica_is_enough_when_the_whole_batch_has_more() {
    // PyTorch refuses one value per channel only for the global batch.
    sync_matches_whole_batch(BatchNorm1d::new, &[3, 5], [1, 2]);
}

#[test]
fn an_empty_shard_contributes_nothing() {
    sync_matches_whole_batch(BatchNorm2d::new, &[5, 2, 3, 3], [5, 0]);
}

#[test]
fn under_autocast_half_precision_input_is_synchronised_in_f32_and_stays_half() {
    let outputs = on_two_replicas(|rank, dev, comm| {
        let mut bn = layer(BatchNorm2d::new, 3, &dev);
        bn.convert_sync_batchnorm(&comm);
        let x = random(&[4, 3, 2, 2], 0.5, 20 + rank as u64, &dev)
            .to_dtype(DType::BF16)
            .unwrap();
        let y = autocast(DType::BF16, || bn.forward(&x)).unwrap();
        // The f32 computation, rounded once: autocast's batch norm keeps its input's dtype, as
        // PyTorch's does, and computes (and synchronises) in f32.
        let widened = bn.forward(&x.to_dtype(DType::F32).unwrap()).unwrap();
        let in_f32 = |t: &Tensor| values(&t.to_dtype(DType::F32).unwrap());
        (y.dtype(), in_f32(&y), in_f32(&widened.to_dtype(DType::BF16).unwrap()))
    });
    for (dtype, y, widened) in outputs {
        assert_eq!(dtype, DType::BF16);
        assert_close("y", &y, &widened, TOL);
    }
}

/// A group of two whose collectives must never run.
struct Unreachable;

impl Unreachable {
    fn refuse(op: &'static str) -> Result<()> {
        Err(Error::Collective {
            op,
            rank: 0,
            msg: "evaluation must not communicate".into(),
        })
    }
}

impl Communicator for Unreachable {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn all_reduce(&self, _: &BufferRef, _: ReduceOp) -> Result<()> {
        Self::refuse("all_reduce")
    }
    fn broadcast(&self, _: &BufferRef, _: usize) -> Result<()> {
        Self::refuse("broadcast")
    }
    fn all_gather(&self, _: &BufferRef, _: &BufferRef) -> Result<()> {
        Self::refuse("all_gather")
    }
    fn reduce_scatter(&self, _: &BufferRef, _: &BufferRef, _: ReduceOp) -> Result<()> {
        Self::refuse("reduce_scatter")
    }
    fn barrier(&self) -> Result<()> {
        Self::refuse("barrier")
    }
}

#[test]
fn evaluation_uses_the_running_statistics_without_communicating() {
    let dev = device(0);
    let plain = layer(BatchNorm2d::new, 3, &dev);
    // Non-trivial running statistics from one training step.
    plain.forward(&random(&[4, 3, 2, 2], 2.0, 5, &dev)).unwrap();
    let mut synced = layer(BatchNorm2d::new, 3, &dev);
    synced.load_state_dict(&plain.state_dict()).unwrap();
    let comm: Arc<dyn Communicator> = Arc::new(Unreachable);
    synced.convert_sync_batchnorm(&comm);
    let (mut plain, x) = (plain, random(&[2, 3, 2, 2], 1.0, 6, &dev));
    plain.eval();
    synced.eval();
    assert_eq!(
        values(&synced.forward(&x).unwrap()),
        values(&plain.forward(&x).unwrap())
    );
    // Training would communicate: the stub's refusal comes back as an error naming the cause.
    synced.train();
    let err = synced.forward(&x).unwrap_err().to_string();
    assert!(
        err.contains("SyncBatchNorm") && err.contains("evaluation must not communicate"),
        "{err}"
    );
}

#[test]
fn a_world_of_one_is_batchnorm() {
    let dev = device(0);
    let shape = [6, 3, 2, 2];
    let (x, r) = (random(&shape, 0.5, 7, &dev), random(&shape, 0.0, 8, &dev));
    let reference = step(&layer(BatchNorm2d::new, 3, &dev), &x, &r, 1.0).unwrap();
    let mut bn = layer(BatchNorm2d::new, 3, &dev);
    let comm: Arc<dyn Communicator> = Arc::new(LocalCommunicator::group(vec![dev.backend().clone()]).remove(0));
    bn.convert_sync_batchnorm(&comm);
    assert!(bn.is_synchronized());
    let synced = step(&bn, &x, &r, 1.0).unwrap();
    assert_eq!(format!("{synced:?}"), format!("{reference:?}"));
}

#[test]
fn conversion_renames_the_layers_as_pytorch_and_keeps_the_state_dict_names() {
    let dev = device(0);
    let mut model = models::convnet_bn(&dev, &Generator::new(0)).unwrap();
    let names = |m: &dyn Module| m.state_dict().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let before = names(&model);
    let comm: Arc<dyn Communicator> = Arc::new(LocalCommunicator::group(vec![dev.backend().clone()]).remove(0));
    model.convert_sync_batchnorm(&comm);
    assert_eq!(names(&model), before);
    let text = model.describe();
    assert!(
        text.contains("(1): SyncBatchNorm(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"),
        "{text}"
    );
    assert!(text.contains("(5): SyncBatchNorm(32, "), "{text}");
    assert!(!text.contains("BatchNorm2d"), "{text}");
}

#[test]
fn replicas_that_disagree_on_channels_get_an_error_on_every_rank() {
    let results = on_two_replicas(|rank, dev, comm| {
        let channels = 3 + rank;
        let mut bn = BatchNorm2d::new(channels, &dev).unwrap();
        bn.convert_sync_batchnorm(&comm);
        bn.forward(&random(&[4, channels, 2, 2], 0.0, 3, &dev)).map(|_| ())
    });
    for (rank, r) in results.into_iter().enumerate() {
        let err = r.expect_err("mismatched channels").to_string();
        assert!(
            err.contains("SyncBatchNorm") && err.contains("num_features") && err.contains("elements"),
            "rank {rank}: {err}"
        );
    }
}

#[test]
fn a_whole_batch_of_one_value_per_channel_is_refused_on_every_rank() {
    let results = on_two_replicas(|rank, dev, comm| {
        let mut bn = BatchNorm1d::new(3, &dev).unwrap();
        bn.convert_sync_batchnorm(&comm);
        // One row on rank 0, none on rank 1.
        bn.forward(&random(&[1 - rank, 3], 0.0, 3, &dev)).map(|_| ())
    });
    for r in results {
        let err = r.expect_err("one value in all").to_string();
        assert!(err.contains("more than 1 value per channel"), "{err}");
    }
}

const STEPS: usize = 2;

fn convnet_weights(net: &dyn Module) -> Vec<Vec<f32>> {
    net.state_dict()
        .iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(_, t)| values(t))
        .collect()
}

/// `STEPS` SGD steps of convnet-bn: one device on the whole batch, or (given a rank and its
/// [SyncBatchNorm, reducer] communicators, two groups) that replica on its half of the batch.
fn train_convnet(rank_and_comms: Option<(usize, [Arc<dyn Communicator>; 2])>) -> Vec<Vec<f32>> {
    let rank = rank_and_comms.as_ref().map_or(0, |(r, _)| *r);
    let dev = device(rank);
    let mut net = models::convnet_bn(&dev, &Generator::new(4)).unwrap();
    let g = Generator::new(9);
    let x = Tensor::rand_normal([16, 1, 28, 28], 0.0, 1.0, DType::F32, &g, &dev).unwrap();
    let labels: Vec<u32> = (0..16).map(|i| (i * 3) % 10).collect();
    let y = Tensor::from_vec(labels, [16], &dev).unwrap();
    let (x, y, reducer) = match rank_and_comms {
        None => (x, y, None),
        Some((rank, [batchnorm, gradients])) => {
            net.convert_sync_batchnorm(&batchnorm);
            let reducer = Reducer::for_model(&net, gradients, ReducerConfig::default()).unwrap();
            (
                x.narrow(0, rank * 8, 8).unwrap(),
                y.narrow(0, rank * 8, 8).unwrap(),
                Some(reducer),
            )
        }
    };
    let mut opt = Sgd::new(net.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    for _ in 0..STEPS {
        opt.zero_grad();
        net.forward(&x).unwrap().cross_entropy(&y).unwrap().backward().unwrap();
        if let Some(reducer) = &reducer {
            reducer.finish().unwrap();
        }
        opt.step().unwrap();
    }
    convnet_weights(&net)
}

#[test]
fn data_parallel_convnet_bn_with_sync_batchnorm_trains_as_one_device_with_the_whole_batch() {
    let reference = train_convnet(None);
    // The reducer's group, apart from SyncBatchNorm's (as `lockstep train --sync-batchnorm` does).
    let reducer_comms = LocalCommunicator::group((0..2).map(|i| device(i).backend().clone()).collect());
    let reducer_comms = Mutex::new(reducer_comms.into_iter().map(Some).collect::<Vec<_>>());
    let replicas = on_two_replicas(move |rank, _, batchnorm| {
        let gradients: Arc<dyn Communicator> = Arc::new(reducer_comms.lock().unwrap()[rank].take().unwrap());
        train_convnet(Some((rank, [batchnorm, gradients])))
    });
    assert_eq!(
        replicas[0], replicas[1],
        "replicas (weights and running statistics) stay identical"
    );
    assert_ne!(
        replicas[0],
        convnet_weights(&models::convnet_bn(&device(0), &Generator::new(4)).unwrap())
    );
    for (i, (got, want)) in replicas[0].iter().zip(&reference).enumerate() {
        assert_close(&format!("state {i}"), got, want, 1e-4);
    }
}

/// `DataParallel::on_threads(..).sync_batchnorm(true)`: the one-call form converts each
/// replica's BatchNorm before its reducer, and trains convnet-bn as one device on the global
/// batch does.
#[test]
fn data_parallel_in_one_call_with_sync_batchnorm_trains_as_one_device() {
    use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
    use lockstep_core::train::{DataParallel, Progress, Trainer, TrainerConfig, TrainingSetup};
    use lockstep_core::{HostVec, data::Dataset};

    let g = Generator::new(9);
    let images = Tensor::rand_normal([16, 1, 28, 28], 0.0, 1.0, DType::F32, &g, &device(0)).unwrap();
    let images = HostTensor::new(HostVec::F32(values(&images)), [16, 1, 28, 28]).unwrap();
    let labels = HostTensor::new(HostVec::U32((0..16).map(|i| (i * 3) % 10).collect()), [16]).unwrap();
    let data: Arc<dyn Dataset> = Arc::new(TensorDataset::new(vec![images, labels]).unwrap());
    let build = |device: &Device| {
        let net = models::convnet_bn(device, &Generator::new(4))?;
        let opt = Sgd::new(net.parameters(), SgdConfig::new(0.1).momentum(0.9))?;
        Ok(TrainingSetup::new(net, opt))
    };
    let config = TrainerConfig {
        max_epochs: STEPS as u64,
        progress: Progress::Off,
        ..Default::default()
    };

    let mut alone = build(&device(0)).unwrap();
    let loader = DataLoader::simple(
        data.clone(),
        false,
        0,
        DataLoaderConfig {
            batch_size: 16,
            ..Default::default()
        },
    );
    Trainer::new(config.clone())
        .unwrap()
        .fit(&mut alone, &loader.unwrap(), None)
        .unwrap();

    let trained = DataParallel::on_threads(vec![device(0), device(1)])
        .config(config)
        .batch_size(16)
        .shuffle(false, 0)
        .sync_batchnorm(true)
        .fit(data, None, |replica| build(&replica.device))
        .unwrap();
    let (got, want) = (
        convnet_weights(trained.setup.model.as_ref()),
        convnet_weights(alone.model.as_ref()),
    );
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("state {i}"), got, want, 1e-4);
    }
}
