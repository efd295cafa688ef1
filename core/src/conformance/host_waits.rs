//! Whether a training step leaves the device's queue alone: a GPT's bf16-mixed steps (the
//! weights' bf16 copies, forward and loss under autocast, backward, clipping by the global
//! norm, AdamW) read nothing back, so the host never waits for a GPU inside a step and queues
//! the next launches while the device works. Only reading a value (the loss, for a log)
//! drains the queue, and that is the caller's choice.

use crate::autocast::{AutocastGuard, prefetch};
use crate::error::Result;
use crate::models::{GptConfig, gpt};
use crate::nn::ModuleExt;
use crate::optim::{Adam, AdamConfig, Optimizer, clip_grad_norm};
use crate::{DType, Device, Generator, Tensor};

/// The host's waits for all of `device`'s queued work (`WorkCounters::host_waits`) during
/// `steps` gpt-tiny bf16-mixed training steps at batch 2, after two warm-up steps (whose
/// first-use checks read values back); `None` where the backend does not count them.
pub fn training_step_host_waits(device: &Device, steps: usize) -> Result<Option<u64>> {
    let config = GptConfig::named("gpt-tiny").expect("a preset").vocab_size(65);
    let generator = Generator::new(0);
    let model = gpt(config, device, &generator)?;
    let params = model.parameters();
    let mut adamw = Adam::adamw(params.clone(), AdamConfig::adamw())?;
    let (batch, t) = (2, config.block_size);
    let ids: Vec<u32> = (0..batch * (t + 1))
        .map(|_| generator.next_below(config.vocab_size as u64) as u32)
        .collect();
    let rows = Tensor::from_vec(ids, [batch, t + 1], device)?;
    let x = rows.narrow(1, 0, t)?.contiguous()?;
    let targets = rows.narrow(1, 1, t)?.contiguous()?.reshape([batch * t])?;
    let mut step = || -> Result<()> {
        adamw.zero_grad();
        let loss = {
            let _autocast = AutocastGuard::new(DType::BF16)?;
            prefetch(adamw.parameters())?;
            model
                .forward(&x)?
                .reshape([batch * t, config.vocab_size])?
                .cross_entropy(&targets)?
        };
        loss.backward()?;
        clip_grad_norm(&params, 1.0)?;
        adamw.step()
    };
    for _ in 0..2 {
        step()?;
    }
    device.synchronize()?;
    let before = device.backend().work_counters().host_waits;
    for _ in 0..steps {
        step()?;
    }
    let after = device.backend().work_counters().host_waits;
    device.synchronize()?;
    Ok(before.zip(after).map(|(b, a)| a - b))
}
