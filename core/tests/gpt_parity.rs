//! A GPT trains as PyTorch trains nanoGPT's architecture: from the same initial weights, on the
//! same token batches, with AdamW (nanoGPT's betas and weight decay on matrices only) and
//! gradients clipped at 1.0, the per-step training loss matches PyTorch's within 1e-4 relative
//! over 20 steps, for `gpt-tiny` and a 4-layer 256-wide model. PyTorch's values are a committed
//! fixture written by scripts/gpt_parity.py; `fill` and `batch` mirror that script's functions.

use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, DecayScope, Optimizer, clip_grad_norm};
use lockstep_core::{Device, Generator, HostVec, Tensor};
use safetensors::SafeTensors;

mod parity_support;
use parity_support::{assert_losses_match, f32s, fixture, uniform};

// These mirror the script's constants.
const STEPS: usize = 20;
const BATCH: usize = 8;
const BATCHES: usize = 4;
const VOCAB: usize = 65;
const BLOCK: usize = 64;

/// The initial value of state-dict tensor number `stream`, named `name`.
fn fill(name: &str, n: usize, stream: u64) -> Vec<f32> {
    let u = uniform(stream, n).into_iter();
    let v: Vec<f64> = if name.contains(".ln_") {
        if name.ends_with("weight") {
            u.map(|u| 1.0 + 0.1 * u).collect()
        } else {
            u.map(|u| 0.1 * u).collect()
        }
    } else if name.ends_with("bias") {
        u.map(|u| 0.02 * u).collect()
    } else {
        u.map(|u| 0.02 * 3f64.sqrt() * u).collect()
    };
    v.into_iter().map(|v| v as f32).collect()
}

fn batch(step: usize, dev: &Device) -> (Tensor, Tensor) {
    let u = uniform(3000 + (step % BATCHES) as u64, BATCH * (BLOCK + 1));
    let tokens: Vec<i64> = u
        .into_iter()
        .map(|u| ((u + 1.0) * 0.5 * VOCAB as f64).floor() as i64)
        .collect();
    let rows = Tensor::from_host(HostVec::I64(tokens), [BATCH, BLOCK + 1], dev).unwrap();
    (
        rows.narrow(1, 0, BLOCK).unwrap().contiguous().unwrap(),
        rows.narrow(1, 1, BLOCK).unwrap().contiguous().unwrap(),
    )
}

/// The state-dict (name, shape) pairs PyTorch's model has, from the fixture's metadata.
fn pytorch_state_dict(file: &[u8], model: &str) -> Vec<(String, Vec<usize>)> {
    let (_, meta) = SafeTensors::read_metadata(file).unwrap();
    let json = &meta.metadata().as_ref().unwrap()[&format!("{model}.state_dict")];
    serde_json::from_str(json).unwrap()
}

fn losses_match(model: &str, config: GptConfig) {
    let dev = Device::cpu();
    let mut net = gpt(config, &dev, &Generator::new(0)).unwrap();
    let bytes = fixture("gpt-parity/reference.safetensors");
    let names: Vec<(String, Vec<usize>)> = net
        .state_dict()
        .into_iter()
        .map(|(name, t)| (name, t.dims().to_vec()))
        .collect();
    assert_eq!(
        names,
        pytorch_state_dict(&bytes, model),
        "{model}: state-dict names and shapes"
    );

    let state: Vec<(String, Tensor)> = net
        .state_dict()
        .into_iter()
        .enumerate()
        .map(|(k, (name, t))| {
            // The head is the token embedding (state-dict entry 0): both names hold its value.
            let (source, stream) = if name == "lm_head.weight" {
                ("transformer.wte.weight", 0)
            } else {
                (name.as_str(), k as u64)
            };
            let value = fill(source, t.elem_count(), stream);
            let value = Tensor::from_host(HostVec::F32(value), t.dims().to_vec(), &dev).unwrap();
            (name, value)
        })
        .collect();
    net.load_state_dict(&state).unwrap();
    net.train();
    let params = net.parameters();
    let config = AdamConfig::adamw()
        .lr(1e-3)
        .betas(0.9, 0.95)
        .eps(1e-8)
        .weight_decay(0.1)
        .decay_scope(DecayScope::Weights);
    let mut opt = Adam::adamw(params.clone(), config).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = batch(step, &dev);
        let logits = net.forward(&x).unwrap();
        let loss = logits
            .reshape([BATCH * BLOCK, VOCAB])
            .unwrap()
            .cross_entropy(&y.reshape([BATCH * BLOCK]).unwrap())
            .unwrap();
        opt.zero_grad();
        loss.backward().unwrap();
        clip_grad_norm(&params, 1.0).unwrap();
        opt.step().unwrap();
        losses.push(loss.item().unwrap());
    }
    let expected = SafeTensors::deserialize(&bytes).unwrap();
    assert_losses_match(model, &losses, &f32s(&expected, &format!("{model}.loss")), 1e-4);
}

fn sized(n_layer: usize, n_head: usize, n_embd: usize) -> GptConfig {
    GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(VOCAB)
        .block_size(BLOCK)
        .layers(n_layer, n_head, n_embd)
}

#[test]
fn gpt_tiny_losses_match_pytorch_over_20_adamw_steps() {
    losses_match("gpt-tiny", sized(2, 2, 128));
}

#[test]
fn four_layer_256_wide_gpt_losses_match_pytorch_over_20_adamw_steps() {
    losses_match("gpt-4x256", sized(4, 4, 256));
}

#[test]
fn gpt2_has_nanogpts_parameter_count() {
    let bytes = fixture("gpt-parity/reference.safetensors");
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let expected: usize = meta.metadata().as_ref().unwrap()["gpt2.parameters"].parse().unwrap();
    let net = gpt(GptConfig::named("gpt2").unwrap(), &Device::cpu(), &Generator::new(0)).unwrap();
    assert_eq!(net.num_parameters(), expected, "the tied head counts once");
}
