//! Activation checkpointing on the built-in models: a GPT with dropout and a ResNet with
//! BatchNorm train bit for bit as without it (losses, gradients, running statistics); data
//! parallel replicas reduce each parameter's gradient once and agree with the plain run; a
//! checkpointed GPT peaks lower in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lockstep_core::backend::Communicator;
use lockstep_core::distributed::{Reducer, ReducerConfig};
use lockstep_core::models::{Gpt, GptConfig, ResNetConfig, Stem, gpt, resnet};
use lockstep_core::nn::{Module, ModuleExt, Sequential, StagedModel};
use lockstep_core::optim::{Optimizer, Sgd, SgdConfig};
use lockstep_core::rng::BatchWindow;
use lockstep_core::train::pipeline::{Pipeline, ScheduleKind};
use lockstep_core::train::{MicroBatch, StepTimes, Strategy, TrainerConfig};
use lockstep_core::{DType, Device, Generator, Tensor};

mod parallel_support;
mod replica_support;
use parallel_support::on_cpu_ranks;
use replica_support::setup_with;

const STEPS: usize = 3;

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Per step: the loss's bits and every parameter's gradient's bits.
type Trace = Vec<(Vec<u32>, Vec<Vec<u32>>)>;

fn small_gpt(checkpointing: bool, device: &Device) -> Gpt {
    let config = GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(17)
        .block_size(16)
        .layers(3, 2, 32)
        .dropout(0.2)
        .activation_checkpointing(checkpointing);
    gpt(config, device, &Generator::new(4)).unwrap()
}

/// Token ids `[batch, 16]` and their next tokens, flattened.
fn tokens(batch: usize, seed: u64, device: &Device) -> (Tensor, Tensor) {
    let g = Generator::new(seed);
    let ids: Vec<u32> = (0..batch * 17).map(|_| g.next_below(17) as u32).collect();
    let rows: Vec<&[u32]> = ids.chunks(17).collect();
    let input: Vec<u32> = rows.iter().flat_map(|r| r[..16].to_vec()).collect();
    let target: Vec<u32> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
    (
        Tensor::from_vec(input, [batch, 16], device).unwrap(),
        Tensor::from_vec(target, [batch * 16], device).unwrap(),
    )
}

fn gpt_loss(net: &Gpt, ids: &Tensor, targets: &Tensor) -> Tensor {
    let logits = net.forward(ids).unwrap();
    let vocab = logits.dims()[2];
    logits
        .reshape([targets.dims()[0], vocab])
        .unwrap()
        .cross_entropy(targets)
        .unwrap()
}

fn train_gpt(checkpointing: bool) -> Trace {
    let device = Device::cpu();
    let net = small_gpt(checkpointing, &device);
    let mut opt = Sgd::new(net.parameters(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
    (0..STEPS)
        .map(|step| {
            let (ids, targets) = tokens(4, step as u64, &device);
            opt.zero_grad();
            let loss = gpt_loss(&net, &ids, &targets);
            loss.backward().unwrap();
            let grads = net.parameters().iter().map(|p| bits(&p.grad().unwrap())).collect();
            opt.step().unwrap();
            (bits(&loss), grads)
        })
        .collect()
}

#[test]
fn a_checkpointed_gpt_with_dropout_trains_bit_for_bit_as_the_plain_one() {
    let plain = train_gpt(false);
    assert_eq!(train_gpt(true), plain);
    assert_ne!(
        plain[0].0, plain[1].0,
        "the steps differ (the comparison is not vacuous)"
    );
}

/// A ResNet of one block per stage for 8x8 images in 5 classes.
fn small_resnet(checkpointing: bool, device: &Device) -> Sequential {
    let config = ResNetConfig::named("resnet18")
        .unwrap()
        .stem(Stem::Cifar)
        .classes(5)
        .activation_checkpointing(checkpointing);
    let config = ResNetConfig {
        layers: [1, 1, 1, 1],
        ..config
    };
    resnet(config, device, &Generator::new(6)).unwrap()
}

/// Per step: loss and gradients; then the BatchNorm buffers after the last step.
fn train_resnet(checkpointing: bool) -> (Trace, Vec<Vec<u32>>) {
    let (device, g) = (Device::cpu(), Generator::new(6));
    let net = small_resnet(checkpointing, &device);
    let mut opt = Sgd::new(net.parameters(), SgdConfig::new(0.05).momentum(0.9)).unwrap();
    let x = Tensor::rand_normal([4, 3, 8, 8], 0.0, 1.0, DType::F32, &g, &device).unwrap();
    let y = Tensor::from_vec(vec![0u32, 3, 1, 4], [4], &device).unwrap();
    let trace = (0..STEPS)
        .map(|_| {
            opt.zero_grad();
            let loss = net.forward(&x).unwrap().cross_entropy(&y).unwrap();
            loss.backward().unwrap();
            let grads = net.parameters().iter().map(|p| bits(&p.grad().unwrap())).collect();
            opt.step().unwrap();
            (bits(&loss), grads)
        })
        .collect();
    let buffers = net
        .named_buffers()
        .iter()
        .map(|(_, t)| bits(&t.to_dtype(DType::F32).unwrap()))
        .collect();
    (trace, buffers)
}

#[test]
fn a_checkpointed_resnet_trains_bit_for_bit_and_counts_each_batch_once_in_its_batch_norms() {
    let (plain, plain_buffers) = train_resnet(false);
    let (checkpointed, buffers) = train_resnet(true);
    assert_eq!(checkpointed, plain);
    assert_eq!(buffers, plain_buffers, "running means, variances and batch counts");
}

/// Two replicas of the small GPT, each with its half of the batch in its batch window, the
/// reducer averaging: the final weights, and how often each parameter's gradient was ready
/// in each backward.
fn data_parallel_gpt(checkpointing: bool) -> Vec<(Vec<Vec<u32>>, Vec<usize>)> {
    on_cpu_ranks(2, move |device, comm| {
        let rank = comm.rank();
        let net = small_gpt(checkpointing, &device);
        let params = net.parameters();
        let ready = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
        for p in &params {
            let ready = ready.clone();
            p.add_grad_ready_hook(Arc::new(move |p: &Tensor| {
                *ready.lock().unwrap().entry(p.id()).or_default() += 1;
                Ok(())
            }));
        }
        let config = ReducerConfig {
            first_bucket_bytes: 4_000,
            bucket_bytes: 16_000,
        };
        let reducer = Reducer::new(&params, Arc::new(comm), config).unwrap();
        assert!(reducer.buckets().len() >= 3, "{:?}", reducer.buckets());
        let mut opt = Sgd::new(params.clone(), SgdConfig::new(0.1).momentum(0.9)).unwrap();
        let mut counts = Vec::new();
        for step in 0..STEPS {
            let (ids, targets) = tokens(4, step as u64, &device);
            let (ids, targets) = (
                ids.narrow(0, 2 * rank, 2).unwrap(),
                targets.narrow(0, 32 * rank, 32).unwrap(),
            );
            opt.zero_grad();
            ready.lock().unwrap().clear();
            let window = BatchWindow {
                start: 2 * rank,
                len: 2,
                global: 4,
            };
            let loss = {
                let _window = window.enter();
                gpt_loss(&net, &ids, &targets)
            };
            loss.backward().unwrap();
            reducer.finish().unwrap();
            opt.step().unwrap();
            let ready = ready.lock().unwrap();
            counts.extend(params.iter().map(|p| ready.get(&p.id()).copied().unwrap_or(0)));
        }
        (net.parameters().iter().map(bits).collect(), counts)
    })
}

#[test]
fn data_parallel_replicas_reduce_each_parameter_once_and_match_the_plain_replicas() {
    let plain = data_parallel_gpt(false);
    let checkpointed = data_parallel_gpt(true);
    for (rank, (weights, counts)) in checkpointed.iter().enumerate() {
        assert!(
            counts.iter().all(|&c| c == 1),
            "rank {rank}: hooks per parameter {counts:?}"
        );
        assert_eq!(weights, &plain[rank].0, "rank {rank}'s weights");
    }
    assert_eq!(checkpointed[0].0, checkpointed[1].0, "the replicas agree");
}

/// The peak allocation of one forward and backward of a 6-layer GPT on a device of its own.
fn peak_of_one_step(checkpointing: bool, device: &Device) -> u64 {
    let config = GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(17)
        .block_size(64)
        .layers(6, 2, 64)
        .dropout(0.1)
        .activation_checkpointing(checkpointing);
    let net = gpt(config, device, &Generator::new(4)).unwrap();
    let g = Generator::new(9);
    let ids: Vec<u32> = (0..8 * 64).map(|_| g.next_below(17) as u32).collect();
    let ids = Tensor::from_vec(ids, [8, 64], device).unwrap();
    let targets = ids.reshape([8 * 64]).unwrap();
    let base = device.backend().memory_stats().allocated_bytes;
    gpt_loss(&net, &ids, &targets).backward().unwrap();
    device.backend().memory_stats().peak_allocated_bytes - base
}

#[test]
fn a_checkpointed_gpt_of_several_layers_peaks_lower_in_memory() {
    // Devices no other test in this binary allocates on: their peaks are this test's.
    let plain = peak_of_one_step(false, &Device::parse("cpu:6").unwrap());
    let checkpointed = peak_of_one_step(true, &Device::parse("cpu:7").unwrap());
    assert!(
        (checkpointed as f64) < 0.6 * plain as f64,
        "peak above the parameters: {checkpointed} bytes checkpointed, {plain} plain"
    );
}

/// One step of a two-stage 1F1B pipeline (cpu:2, cpu:3) over two micro-batches: each
/// parameter's gradient and each buffer, as bits.
fn pipelined_resnet(checkpointing: bool) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let devices = [Device::parse("cpu:2").unwrap(), Device::parse("cpu:3").unwrap()];
    let staged = StagedModel::split(small_resnet(checkpointing, &Device::cpu()), &[5, 5], &devices).unwrap();
    let g = Generator::new(8);
    let x = Tensor::rand_normal([4, 3, 8, 8], 0.0, 1.0, DType::F32, &g, &devices[0]).unwrap();
    let y = Tensor::from_vec(vec![0u32, 3, 1, 4], [4], &devices[1]).unwrap();
    let mut setup = setup_with(Box::new(staged), &devices[0]);
    let mut strategy = Pipeline::new(ScheduleKind::OneFOneB, 2);
    strategy.setup(&mut setup, &TrainerConfig::default()).unwrap();
    let tensors = [x, y];
    strategy
        .forward_backward(&setup, &MicroBatch::whole(&tensors), &mut StepTimes::default())
        .unwrap();
    let cpu = |t: &Tensor| bits(&t.to_device(&Device::cpu()).unwrap().to_dtype(DType::F32).unwrap());
    let grads = setup
        .model
        .parameters()
        .iter()
        .map(|p| cpu(&p.grad().unwrap()))
        .collect();
    let buffers = setup.model.named_buffers().iter().map(|(_, t)| cpu(t)).collect();
    (grads, buffers)
}

#[test]
fn checkpointed_blocks_in_pipeline_stages_give_the_plain_pipelines_gradients() {
    assert_eq!(pipelined_resnet(true), pipelined_resnet(false));
}
