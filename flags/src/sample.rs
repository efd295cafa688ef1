//! `lockstep sample`'s flags: the checkpoint, the prompt and how to draw.

use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// A checkpoint of a GPT (last.safetensors or best.safetensors from --checkpoint-dir).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The text to continue; every character must be in the model's vocabulary.
    #[arg(long, default_value = "\n")]
    pub prompt: String,
    /// How many tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Below 1 picks likelier tokens, above 1 more surprising ones.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Draw only among the K likeliest tokens.
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// The same seed, checkpoint and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// auto (the best device found), cpu, wgpu:N or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

impl Args {
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::bounds::{MOST_RATE, MOST_TOKENS, MOST_VOCAB, positive, within};
        within("--tokens", self.tokens, 0..=MOST_TOKENS)?;
        positive("--temperature", self.temperature, MOST_RATE)?;
        if let Some(k) = self.top_k {
            within("--top-k", k, 1..=MOST_VOCAB)?;
        }
        Ok(())
    }
}
