//! The built-in GPT reads Hugging Face transformers' GPT-2 weights: a small random
//! `GPT2LMHeadModel` saved by transformers (testdata/hf-gpt2, written by
//! scripts/hf_gpt2_fixture.py) gives transformers' logits within 1e-4 and its loss within 1e-5
//! relative, and the loss after one AdamW step within 1e-4; the same weights as a `GPT2Model`
//! file with older versions' mask buffers load alike; a model that does not fit gets an error
//! that says what the file holds.

use lockstep_core::models::{Gpt, GptConfig, GptLayout, GptSizes, gpt};
use lockstep_core::nn::{GeluApproximate, ModuleExt};
use lockstep_core::optim::{Adam, AdamConfig, DecayScope, Optimizer};
use lockstep_core::train::checkpoint::{TensorFile, parse_tensors};
use lockstep_core::{Device, Generator, HostVec, Tensor};
use safetensors::SafeTensors;

// Only the fixture readers: the hashed values are for the tests that compute their weights.
#[allow(dead_code)]
mod parity_support;
use parity_support::{assert_losses_match, f32s, fixture};

// These mirror scripts/hf_gpt2_fixture.py.
const N_LAYER: usize = 2;
const N_HEAD: usize = 2;
const N_EMBD: usize = 16;
const VOCAB: usize = 65;
const POSITIONS: usize = 16;
const BATCH: usize = 4;

fn config() -> GptConfig {
    GptConfig::named("gpt-tiny")
        .unwrap()
        .vocab_size(VOCAB)
        .block_size(POSITIONS)
        .layers(N_LAYER, N_HEAD, N_EMBD)
        .dropout(0.0)
        .gelu(GeluApproximate::Tanh)
}

fn weights(name: &str) -> TensorFile {
    parse_tensors(&fixture(&format!("hf-gpt2/{name}")), name).unwrap()
}

fn model(config: GptConfig) -> Gpt {
    gpt(config, &Device::cpu(), &Generator::new(7)).unwrap()
}

/// The reference batch `[BATCH, POSITIONS]`.
fn ids(reference: &SafeTensors) -> Tensor {
    let ids: Vec<i64> = reference
        .tensor("ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    Tensor::from_host(HostVec::I64(ids), [BATCH, POSITIONS], &Device::cpu()).unwrap()
}

/// transformers' loss with `labels=ids`: position t predicts token t + 1.
fn next_token_loss(logits: &Tensor, ids: &Tensor) -> Tensor {
    let n = BATCH * (POSITIONS - 1);
    let predictions = logits.narrow(1, 0, POSITIONS - 1).unwrap().contiguous().unwrap();
    let targets = ids.narrow(1, 1, POSITIONS - 1).unwrap().contiguous().unwrap();
    predictions
        .reshape([n, VOCAB])
        .unwrap()
        .cross_entropy(&targets.reshape([n]).unwrap())
        .unwrap()
}

fn error(net: &Gpt, file: &TensorFile) -> String {
    net.load_pretrained(file).unwrap_err().to_string()
}

#[test]
fn a_transformers_gpt2_gives_transformers_logits_and_losses() {
    let file = weights("model.safetensors");
    let sizes = GptSizes {
        n_layer: N_LAYER,
        n_embd: N_EMBD,
        vocab_size: VOCAB,
        block_size: POSITIONS,
    };
    assert_eq!(GptLayout::of(&file), GptLayout::HuggingFace(sizes));
    let net = model(config());
    net.load_pretrained(&file).unwrap();

    let bytes = fixture("hf-gpt2/reference.safetensors");
    let reference = SafeTensors::deserialize(&bytes).unwrap();
    let ids = ids(&reference);
    let logits = net.forward(&ids).unwrap();
    let theirs = f32s(&reference, "logits");
    let worst = logits
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // The exact GELU would be off by 4.6e-3 here (the script checks it is far beyond this).
    assert!(worst < 1e-4, "logits differ from transformers' by up to {worst:.2e}");
    println!("logits: largest difference from transformers' {worst:.2e} (tolerance 1e-4)");

    let first = next_token_loss(&logits, &ids);
    let decoupled = AdamConfig::adamw()
        .lr(1e-2)
        .betas(0.9, 0.95)
        .eps(1e-8)
        .weight_decay(0.1)
        .decay_scope(DecayScope::Weights);
    let mut opt = Adam::adamw(net.parameters(), decoupled).unwrap();
    first.backward().unwrap();
    opt.step().unwrap();
    let second = next_token_loss(&net.forward(&ids).unwrap(), &ids);

    let losses = f32s(&reference, "loss");
    assert_losses_match("first step", &[first.item().unwrap()], &losses[..1], 1e-5);
    // The step goes through the transposed weights' gradients; Adam's first step divides each
    // gradient by its own size, so rounding weighs more there.
    assert_losses_match("after one AdamW step", &[second.item().unwrap()], &losses[1..], 1e-4);
}

#[test]
fn a_gpt2model_file_without_prefix_and_with_mask_buffers_loads_the_same_weights() {
    let (prefixed, legacy) = (model(config()), model(config()));
    prefixed.load_pretrained(&weights("model.safetensors")).unwrap();
    let file = weights("gpt2model-legacy.safetensors");
    assert!(file.get("h.0.attn.bias").is_some() && file.get("wte.weight").is_some());
    legacy.load_pretrained(&file).unwrap();
    let values = |net: &Gpt| -> Vec<(String, Vec<f32>)> {
        net.state_dict()
            .into_iter()
            .map(|(name, t)| (name, t.to_vec::<f32>().unwrap()))
            .collect()
    };
    assert_eq!(values(&prefixed), values(&legacy));

    // Saved again, the weights are in our layout, which loads as it always has.
    let path = std::env::temp_dir().join(format!("lockstep-hf-gpt2-{}.safetensors", std::process::id()));
    legacy.save(&path).unwrap();
    let ours = parse_tensors(&std::fs::read(&path).unwrap(), "saved").unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(GptLayout::of(&ours), GptLayout::NanoGpt);
    let reloaded = model(config());
    reloaded.load_pretrained(&ours).unwrap();
    assert_eq!(values(&reloaded), values(&legacy));
}

#[test]
fn a_model_that_does_not_fit_is_told_what_the_file_holds() {
    let file = weights("model.safetensors");
    let holds = "n_layer 2, n_embd 16, vocab_size 65, block_size 16";

    let deeper = error(&model(config().layers(3, N_HEAD, N_EMBD)), &file);
    for part in [
        "missing: transformer.h.2.ln_1.weight",
        holds,
        "n_layer 3",
        "config.json",
    ] {
        assert!(deeper.contains(part), "{part:?} not in: {deeper}");
    }
    let wider_vocab = error(&model(config().vocab_size(50257)), &file);
    for part in ["transformer.wte.weight expected [50257, 16] got [65, 16]", holds] {
        assert!(wider_vocab.contains(part), "{part:?} not in: {wider_vocab}");
    }
    let exact = error(&model(config().gelu(GeluApproximate::Exact)), &file);
    assert!(
        exact.contains("tanh GELU") && exact.contains("GeluApproximate::Tanh"),
        "{exact}"
    );
}

#[test]
fn an_untied_head_is_refused() {
    let mut file = weights("model.safetensors");
    let wte = file.get("transformer.wte.weight").unwrap().clone();
    let HostVec::F32(mut values) = wte.data.clone() else {
        panic!("wte is f32")
    };
    values[0] += 1.0;
    let head = lockstep_core::data::HostTensor {
        data: HostVec::F32(values),
        shape: wte.shape.clone(),
    };
    file.tensors.push(("lm_head.weight".to_string(), head));
    let message = error(&model(config()), &file);
    assert!(
        message.contains("lm_head.weight differs from its wte.weight"),
        "{message}"
    );

    // The same head, tied, loads.
    let last = file.tensors.len() - 1;
    file.tensors[last].1 = wte;
    model(config()).load_pretrained(&file).unwrap();
}
