//! `lockstep bench gpt`: full training steps of a GPT (nanoGPT's `gpt-char` by default: 6
//! layers, 6 heads, 384 wide, context 256, dropout 0.2, 65 characters) on a fixed batch of
//! token windows, with nanoGPT's recipe (AdamW betas 0.9/0.99, weight decay 0.1 on matrices,
//! clipping at 1.0), in each precision asked for; tokens per second and peak memory.

use lockstep_core::models::{GptConfig, gpt};
use lockstep_core::nn::ModuleExt;
use lockstep_core::optim::{Adam, AdamConfig, DecayScope};
use lockstep_core::{Device, Generator, Tensor};
use serde::Serialize;

use super::steps::{self, StepResult, Steps};
use super::timing::Timing;

#[derive(Clone, Debug, Serialize)]
pub struct GptPlan {
    pub model: String,
    /// The model's sizes, flat in the plan's JSON (`vocab_size`, `n_layer`, …).
    #[serde(flatten)]
    pub config: GptConfig,
    pub batch: usize,
    pub lr: f64,
    pub betas: (f64, f64),
    pub weight_decay: f64,
    pub clip: f64,
    /// `32` or `bf16-mixed`, each measured in turn.
    pub precisions: Vec<String>,
    /// One repetition is one training step ended by a host sync (reading the loss).
    pub timing: Timing,
    /// Whether the PyTorch peer also measures its model under `torch.compile` (on CUDA, where
    /// nanoGPT trains that way; elsewhere compiling would cost more than it measures).
    pub compile: bool,
    /// Kernels to list from one more step timed kernel by kernel (`--kernels`; ours alone).
    #[serde(skip)]
    pub kernel_profile: usize,
}

impl GptPlan {
    /// The preset `model` (gpt-tiny, gpt-char, gpt2) at `batch` on a character vocabulary.
    pub fn new(model: &str, batch: usize, precisions: Vec<String>) -> anyhow::Result<GptPlan> {
        let c = GptConfig::named(model).ok_or_else(|| {
            anyhow::anyhow!(
                "bench gpt knows {}, not {model}",
                lockstep_core::models::gpt::NAMES.join(", ")
            )
        })?;
        // A character vocabulary (shakespeare-char's 65) except for GPT-2's tokenizer.
        let vocab_size = if model == "gpt2" { c.vocab_size } else { 65 };
        Ok(GptPlan {
            model: model.into(),
            config: c.vocab_size(vocab_size),
            batch,
            lr: 1e-3,
            betas: (0.9, 0.99),
            weight_decay: 0.1,
            clip: 1.0,
            precisions,
            timing: steps::MODEL_TIMING,
            compile: false,
            kernel_profile: 0,
        })
    }
}

pub fn run(device: &Device, plan: &GptPlan) -> anyhow::Result<Vec<StepResult>> {
    let generator = Generator::new(0);
    let model = gpt(plan.config, device, &generator)?;
    let params = model.parameters();
    let adamw = AdamConfig::adamw()
        .lr(plan.lr)
        .betas(plan.betas.0, plan.betas.1)
        .weight_decay(plan.weight_decay)
        .decay_scope(DecayScope::Weights);
    let mut opt = Adam::adamw(params.clone(), adamw)?;
    let tokens = plan.batch * (plan.config.block_size + 1);
    let ids: Vec<u32> = (0..tokens)
        .map(|_| generator.next_below(plan.config.vocab_size as u64) as u32)
        .collect();
    let rows = Tensor::from_vec(ids, [plan.batch, plan.config.block_size + 1], device)?;
    let x = rows.narrow(1, 0, plan.config.block_size)?.contiguous()?;
    let y = rows.narrow(1, 1, plan.config.block_size)?.contiguous()?;
    let flat = plan.batch * plan.config.block_size;
    let targets = y.reshape([flat])?;
    let steps = Steps {
        loss: Box::new(|| {
            model
                .forward(&x)?
                .reshape([flat, plan.config.vocab_size])?
                .cross_entropy(&targets)
        }),
        optimizer: &mut opt,
        clip: Some((params, plan.clip)),
        batch: plan.batch,
        items_per_step: flat,
        kernel_profile: plan.kernel_profile,
    };
    steps::measure(device, &plan.timing, &plan.precisions, steps)
}
