//! The checkpoint against the same block run plainly: same output, same gradients bit for bit,
//! streams and running statistics where the plain run leaves them, hooks once.

use std::sync::{Arc, Mutex};

use super::*;
use crate::autocast::autocast;
use crate::device::Device;
use crate::dtype::DType;
use crate::nn::{BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Linear, Module, ModuleExt};
use crate::rng::Generator;

/// linear, GELU, dropout, linear: a block with parameters and a random draw.
#[derive(Clone)]
struct Block {
    fc1: Linear,
    drop: Dropout,
    fc2: Linear,
}

impl Block {
    fn new(stream: &Arc<Generator>) -> Block {
        let (dev, g) = (Device::cpu(), Generator::new(7));
        Block {
            fc1: Linear::new(6, 12, true, &dev, &g).unwrap(),
            drop: Dropout::new(0.3, stream.clone()).unwrap(),
            fc2: Linear::new(12, 6, true, &dev, &g).unwrap(),
        }
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.drop.forward(&self.fc1.forward(x)?.gelu()?)?)
    }
    fn parameters(&self) -> Vec<Tensor> {
        [&self.fc1, &self.fc2].iter().flat_map(|l| l.parameters()).collect()
    }
}

fn squares(y: &Tensor) -> Tensor {
    y.mul(y).unwrap().sum_all().unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Two blocks, a dropout between them, a loss: the output's bits, every gradient's bits, the stream's state.
fn run(checkpointed: bool, precision: Option<DType>) -> (Vec<u32>, Vec<Vec<u32>>, (u64, u64)) {
    let stream = Arc::new(Generator::new(11));
    let blocks = [Block::new(&stream), Block::new(&stream)];
    let between = Dropout::new(0.5, stream.clone()).unwrap();
    let x = Tensor::rand_normal([4, 6], 0.0, 1.0, DType::F32, &Generator::new(3), &Device::cpu())
        .unwrap()
        .requires_grad(true);
    let apply = |b: &Block, h: &Tensor| -> Result<Tensor> {
        if checkpointed {
            let b = b.clone();
            checkpoint(h, move |h| b.forward(h))
        } else {
            b.forward(h)
        }
    };
    let forward = || -> Result<Tensor> {
        let h = apply(&blocks[0], &x)?;
        apply(&blocks[1], &between.forward(&h)?)
    };
    let y = match precision {
        Some(dtype) => autocast(dtype, forward),
        None => forward(),
    }
    .unwrap();
    squares(&y.to_dtype(DType::F32).unwrap()).backward().unwrap();
    let mut grads = vec![bits(&x.grad().unwrap())];
    for b in &blocks {
        grads.extend(b.parameters().iter().map(|p| bits(&p.grad().unwrap())));
    }
    (bits(&y), grads, stream.state())
}

#[test]
fn gradients_outputs_and_the_stream_are_the_plain_runs_bit_for_bit() {
    assert_eq!(run(true, None), run(false, None));
}

#[test]
fn under_autocast_the_recompute_runs_in_the_first_forwards_precision() {
    assert_eq!(run(true, Some(DType::BF16)), run(false, Some(DType::BF16)));
}

#[test]
fn without_the_graph_it_is_a_plain_call() {
    let x = Tensor::ones([2], DType::F32, &Device::cpu())
        .unwrap()
        .requires_grad(true);
    let y = crate::autograd::no_grad(|| checkpoint(&x, |x| x.affine(2.0, 0.0))).unwrap();
    assert!(!y.tracks_grad());
}

#[test]
fn a_tensor_the_closure_captures_from_the_outer_graph_gets_its_gradient() {
    let dev = Device::cpu();
    let a = Tensor::from_slice(&[1f32, 2., 3.], [3], &dev)
        .unwrap()
        .requires_grad(true);
    let scaled = a.affine(3.0, 0.0).unwrap();
    let x = Tensor::from_slice(&[4f32, 5., 6.], [3], &dev)
        .unwrap()
        .requires_grad(true);
    let captured = scaled.clone();
    let y = checkpoint(&x, move |x| x.mul(&captured)).unwrap();
    y.add(&scaled).unwrap().sum_all().unwrap().backward().unwrap();
    // d/da of sum(x·3a + 3a) = 3x + 3.
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), [15., 18., 21.]);
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [3., 6., 9.]);
}

#[test]
fn a_parameter_used_inside_and_outside_fires_its_hook_once_with_its_whole_gradient() {
    let dev = Device::cpu();
    let w = Tensor::from_slice(&[1f32, -2., 0.5], [3], &dev)
        .unwrap()
        .requires_grad(true);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    w.add_grad_ready_hook(Arc::new(move |p: &Tensor| {
        log.lock().unwrap().push(p.grad().unwrap().to_vec::<f32>().unwrap());
        Ok(())
    }));
    let x = Tensor::from_slice(&[2f32, 3., 4.], [3], &dev).unwrap();
    let inner = w.clone();
    // The checkpointed use comes first in the forward, so the walk reaches it last.
    let y = checkpoint(&x, move |x| x.mul(&inner)).unwrap();
    y.add(&w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(*seen.lock().unwrap(), [vec![3f32, 4., 5.]], "once, with x + 1");
}

#[test]
fn batch_norm_takes_each_batch_into_its_running_statistics_once() {
    let (dev, g) = (Device::cpu(), Generator::new(5));
    let conv = Conv2d::new(Conv2dConfig::new(2, 3, 3).padding(1), &dev, &g).unwrap();
    let x = Tensor::rand_normal([2, 2, 4, 4], 0.0, 1.0, DType::F32, &g, &dev).unwrap();
    let state = |checkpointed: bool| {
        let bn = BatchNorm2d::new(3, &dev).unwrap();
        let block = (conv.clone(), bn.clone());
        let forward = move |x: &Tensor| block.1.forward(&block.0.forward(x)?);
        for _ in 0..2 {
            let y = if checkpointed {
                checkpoint(&x, forward.clone())
            } else {
                forward(&x)
            };
            squares(&y.unwrap()).backward().unwrap();
        }
        let buffers: Vec<Vec<u32>> = bn.named_buffers().iter().map(|(_, t)| bits(t)).collect();
        (buffers, bits(&conv.weight.grad().unwrap()))
    };
    let plain = state(false);
    conv.weight.set_grad(None);
    conv.bias.as_ref().unwrap().set_grad(None);
    assert_eq!(state(true), plain);
}

#[test]
fn a_recompute_that_draws_differently_is_an_error() {
    let stream = Arc::new(Generator::new(1));
    let x = Tensor::ones([8], DType::F32, &Device::cpu())
        .unwrap()
        .requires_grad(true);
    let s = stream.clone();
    // A block whose forward depends on state that changes before backward.
    let y = checkpoint(&x, move |x| {
        if s.seed() == 2 {
            Ok(x.clone())
        } else {
            x.dropout(0.5, true, &s)
        }
    })
    .unwrap();
    stream.restore(2, 0);
    let err = y.sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("drew random numbers"), "{err}");
}
