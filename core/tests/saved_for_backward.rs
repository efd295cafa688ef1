//! What the autograd graph keeps alive until backward: each op only the tensors its rule reads
//! (PyTorch's saved tensors), measured as the bytes a fresh CPU device still holds once the
//! forward pass's own handles are gone; and a GPT layer keeps no more than nanoGPT's layer
//! keeps in PyTorch.

use std::sync::Arc;

use lockstep_core::backend::UnaryOp;
use lockstep_core::backend::cpu::CpuBackend;
use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::{DType, Device, Generator, Result, Tensor};

/// A CPU device of its own: its live bytes count nothing else.
fn fresh_cpu() -> Device {
    Device::from_backend(Arc::new(CpuBackend::new(0)))
}

fn live_bytes(device: &Device) -> u64 {
    device.backend().memory_stats().allocated_bytes
}

/// One [64, 64] f32 tensor's bytes.
const ONE: u64 = 64 * 64 * 4;

/// The bytes `build`'s graph holds besides its result, for a [64, 64] f32 leaf `x` that
/// requires grad (alive throughout, so not counted) and a [64] bias leaf.
fn kept_by(build: impl Fn(&Tensor, &Tensor) -> Result<Tensor>) -> u64 {
    let device = fresh_cpu();
    let generator = Generator::new(5);
    let x = Tensor::rand_normal([64, 64], 0.0, 1.0, DType::F32, &generator, &device)
        .unwrap()
        .requires_grad(true);
    let bias = Tensor::rand_normal([64], 0.0, 1.0, DType::F32, &generator, &device)
        .unwrap()
        .requires_grad(true);
    let before = live_bytes(&device);
    let out = build(&x, &bias).unwrap();
    let kept = live_bytes(&device) - before - (out.elem_count() * 4) as u64;
    // The graph still works from what it kept.
    out.sum_all().unwrap().backward().unwrap();
    assert!(x.grad().is_some());
    kept
}

#[test]
fn adds_and_subtracts_keep_neither_operand() {
    let add = kept_by(|x, _| x.neg()?.add(&x.affine(2.0, 1.0)?));
    let sub = kept_by(|x, _| x.neg()?.sub(&x.affine(2.0, 1.0)?));
    assert_eq!((add, sub), (0, 0));
}

#[test]
fn products_keep_both_operands_and_quotients_too() {
    assert_eq!(kept_by(|x, _| x.neg()?.mul(&x.affine(2.0, 1.0)?)), 2 * ONE);
    assert_eq!(kept_by(|x, _| x.neg()?.div(&x.affine(0.0, 2.0)?)), 2 * ONE);
}

#[test]
fn unary_ops_keep_their_input_or_their_output_never_both() {
    // tanh, exp and ReLU read their output (the result itself here), GELU and log their input.
    assert_eq!(kept_by(|x, _| x.neg()?.tanh()), 0);
    assert_eq!(kept_by(|x, _| x.neg()?.exp()), 0);
    assert_eq!(kept_by(|x, _| x.neg()?.relu()), 0);
    assert_eq!(kept_by(|x, _| x.neg()?.gelu()), ONE);
    assert_eq!(kept_by(|x, _| x.affine(0.0, 2.0)?.log()), ONE);
    // Negation and scaling keep nothing: the chain holds no intermediate.
    assert_eq!(kept_by(|x, _| x.neg()?.affine(3.0, 1.0)?.neg()), 0);
}

#[test]
fn a_bias_keeps_nothing_and_an_activation_what_its_gradient_reads() {
    // The trailing negation makes the bias_act's output an intermediate: kept only if the
    // activation's rule reads it.
    assert_eq!(kept_by(|x, b| x.neg()?.bias_act(b, 1, None)?.neg()), 0);
    assert_eq!(kept_by(|x, b| x.neg()?.bias_act(b, 1, Some(UnaryOp::Relu))?.neg()), ONE);
    assert_eq!(kept_by(|x, b| x.neg()?.bias_act(b, 1, Some(UnaryOp::Tanh))?.neg()), ONE);
    // GELU keeps the pre-activation input (the bias is a leaf, alive anyway).
    assert_eq!(kept_by(|x, b| x.neg()?.bias_act(b, 1, Some(UnaryOp::Gelu))?.neg()), ONE);
}

/// nanoGPT's layer (scripts/gpt_model.py) at width 128, 4 heads, 2 sequences of 64 tokens:
/// the bytes of the tensors PyTorch 2.15 saves for backward (`saved_tensors_hooks`, one count
/// per storage, parameters excluded; two layers' minus one's), in f32 and under bf16 autocast
/// (where they include the bf16 copies of the four weight matrices).
const PYTORCH_LAYER_BYTES_F32: u64 = 1_052_672;
const PYTORCH_LAYER_BYTES_BF16: u64 = 987_136;

/// Live bytes a `layers`-layer GPT of that shape adds over its forward pass and loss.
fn forward_bytes(layers: usize, autocast: bool) -> u64 {
    let device = fresh_cpu();
    let config = GptConfig::named("gpt2")
        .unwrap()
        .layers(layers, 4, 128)
        .block_size(64)
        .vocab_size(65);
    let generator = Generator::new(0);
    let model = gpt(config, &device, &generator).unwrap();
    let ids: Vec<u32> = (0..2 * 65).map(|_| generator.next_below(65) as u32).collect();
    let rows = Tensor::from_vec(ids, [2, 65], &device).unwrap();
    let x = rows.narrow(1, 0, 64).unwrap().contiguous().unwrap();
    let y = rows
        .narrow(1, 1, 64)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape([128])
        .unwrap();
    let before = live_bytes(&device);
    let loss = || model.forward(&x)?.reshape([128, 65])?.cross_entropy(&y);
    let loss = if autocast {
        lockstep_core::autocast::autocast(DType::BF16, loss)
    } else {
        loss()
    }
    .unwrap();
    let held = live_bytes(&device) - before;
    drop(loss);
    held
}

#[test]
fn a_gpt_layer_keeps_no_more_than_pytorchs() {
    let f32_layer = forward_bytes(2, false) - forward_bytes(1, false);
    assert!(
        f32_layer <= PYTORCH_LAYER_BYTES_F32,
        "an f32 layer keeps {f32_layer} bytes for backward, PyTorch's {PYTORCH_LAYER_BYTES_F32}"
    );
    // Autocast's bf16 copies of the layer's biases live as long as the region (PyTorch casts
    // them anew at each use and keeps none).
    let bias_copies = 2 * (3 * 128 + 128 + 4 * 128 + 128);
    let bf16_layer = forward_bytes(2, true) - forward_bytes(1, true);
    assert!(
        bf16_layer <= PYTORCH_LAYER_BYTES_BF16 + bias_copies,
        "a bf16-mixed layer keeps {bf16_layer} bytes for backward, PyTorch's {PYTORCH_LAYER_BYTES_BF16} and \
         {bias_copies} of bias copies"
    );
    println!(
        "per layer: f32 {f32_layer} (PyTorch {PYTORCH_LAYER_BYTES_F32}), bf16-mixed {bf16_layer} (PyTorch {PYTORCH_LAYER_BYTES_BF16})"
    );
}
