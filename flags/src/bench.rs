//! `lockstep bench`'s flags: which benchmarks, on which device, at which sizes.

use std::path::PathBuf;

use clap::ValueEnum;

/// The square GEMM sizes measured by default: a CPU's range (a GPU wants `--sizes 4096,8192`).
pub const GEMM_SIZES: [usize; 3] = [512, 1024, 2048];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    Gemm,
    Mlp,
    /// gemm and mlp (the loader has its own run: `bench loader`).
    All,
    /// DataLoader throughput on MNIST with 0, 1, 2 and 4 workers.
    Loader,
    /// A wgpu device (--device wgpu:N): tiled vs naive GEMM at 256/512/1024 and MLP steps/s,
    /// beside the CPU backend.
    Gpu,
    /// Data parallel over --devices: per step, backward time, gradient all-reduce time and
    /// the part of it hidden behind backward.
    Ddp,
    /// A deep MLP (--depth layers of --width) split over --devices: naive model parallel
    /// against GPipe and 1F1B with --micro-batches, steps/s and the measured bubble.
    Pipeline,
    /// ResNet-18 (CIFAR stem) training steps at --batch (default 64) in f32 and bf16-mixed,
    /// images/s and peak memory, and the loader's augmented images/s with 0, 2 and 4 workers.
    Resnet,
    /// A GPT's training steps (--model, default gpt-char; --batch, default 16) in f32 and
    /// bf16-mixed with nanoGPT's recipe: tokens/s and peak memory.
    Gpt,
    /// `lockstep train` of a GPT (--model) on the text file --data over --devices, plain data
    /// parallel beside ZeRO stages 1 and 2 (--batch global, default 16; --steps): seconds per
    /// step, and each rank's peak memory and optimizer state.
    Zero,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    Pytorch,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which benchmarks to run.
    #[arg(value_enum, default_value_t = Which::All)]
    pub which: Which,
    /// CPU worker threads (rayon's pool; the peer gets the same number).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    /// Also run the same benchmarks in this framework and print the ratio.
    #[arg(long, value_enum)]
    pub peer: Option<Peer>,
    /// Write the plan and every number to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The device to measure (`cpu`, `cpu:1`, `wgpu:0`, …).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Hidden widths of the benchmark MLP (784 inputs, 10 classes).
    #[arg(long, value_delimiter = ',', default_value = "512,512")]
    pub hidden: Vec<usize>,
    /// Precision of the MLP steps: 32, 16-mixed or bf16-mixed (the peer uses torch.autocast).
    #[arg(long, default_value = "32", value_parser = ["32", "16-mixed", "bf16-mixed"])]
    pub precision: String,
    /// Element type of the GEMM benchmark's operands (f16 and bf16 accumulate in f32; tf32: f32
    /// operands on TF32 tensor cores, CUDA only, the peer with `allow_tf32`).
    #[arg(long, default_value = "f32", value_parser = ["f32", "tf32", "f16", "bf16"])]
    pub gemm_dtype: String,
    /// Sizes n of the square GEMM benchmark (default 512, 1024, 2048; a GPU wants 4096, 8192).
    #[arg(long, value_delimiter = ',', default_values_t = GEMM_SIZES)]
    pub sizes: Vec<usize>,
    /// MNIST directory for `bench loader` (default: $LOCKSTEP_DATA/mnist, else the per-user
    /// cache); the UTF-8 text file `bench zero` trains on.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The devices of `bench ddp` and `bench zero` (one replica each) and `bench pipeline` (one
    /// stage each).
    #[arg(long, value_delimiter = ',', default_value = "cpu:0,cpu:1")]
    pub devices: Vec<String>,
    /// Batch of the MLP benchmark (for `bench ddp`, the global batch split over --devices;
    /// default 128) and of `bench pipeline` (cut into --micro-batches; default 2048, so a
    /// micro-batch of 256 rows keeps the CPU's GEMM about as efficient as the whole batch).
    #[arg(long)]
    pub batch: Option<usize>,
    /// `bench ddp`: timed steps (after 3 warm-up steps) and bucket capacities in MiB.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    #[arg(long, default_value_t = 1.0)]
    pub first_bucket_mb: f64,
    #[arg(long, default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// `bench pipeline`: hidden layers, their width, and micro-batches per step.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
    #[arg(long, default_value_t = 2048)]
    pub width: usize,
    #[arg(long, default_value_t = 8)]
    pub micro_batches: usize,
    /// `bench gpt`: the preset to measure (gpt-tiny, gpt-char, gpt2).
    #[arg(long, default_value = "gpt-char")]
    pub model: String,
    /// `bench gpt`: the context length T, tokens a sequence (default: the preset's; e.g. 2048
    /// with gpt2 to see attention's memory grow with T).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// `bench resnet` and `bench gpt`: after each precision, one more step with every kernel
    /// timed alone (CUDA devices, and wgpu devices with timestamp queries), and its N longest
    /// kernels listed.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub kernels: usize,
    /// `bench resnet` and `bench gpt` beside a peer: measure the two sides in turn this many
    /// times (a machine whose speed drifts slows both alike) and report each side's median round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub rounds: u16,
}

/// The largest square GEMM measured: three 32768² f32 operands are 12 GiB.
pub const MOST_GEMM: usize = 32768;

impl Args {
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::bounds::*;
        threads("--threads", usize::from(self.threads), 1)?;
        each_within("--hidden", &self.hidden, 1..=MOST_WIDTH)?;
        each_within("--sizes", &self.sizes, 1..=MOST_GEMM)?;
        if let Some(batch) = self.batch {
            within("--batch", batch, 1..=MOST_SAMPLES)?;
        }
        within("--steps", self.steps, 1..=MOST_PARTS)?;
        positive("--first-bucket-mb", self.first_bucket_mb, MOST_BUCKET_MIB)?;
        positive("--bucket-mb", self.bucket_mb, MOST_BUCKET_MIB)?;
        within("--depth", self.depth, 1..=MOST_LAYERS)?;
        if let Some(block) = self.block_size {
            within("--block-size", block, 1..=MOST_TOKENS)?;
        }
        within("--width", self.width, 1..=MOST_GEMM)?;
        within("--micro-batches", self.micro_batches, 1..=MOST_PARTS)?;
        within("--kernels", self.kernels, 0..=MOST_PARTS)?;
        within("--rounds", self.rounds, 1..=100)?;
        Ok(())
    }
}
