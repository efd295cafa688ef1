//! The flags of `lockstep train`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use lockstep_core::distributed::{OnDrift, ReducerConfig, ReplicaCheck, ZeroStage};
use lockstep_core::train::{
    GradientClip, Keep, OnNan, Precision, Progress, ResumeSetting, SchedulerInterval, TrainerConfig,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerKind {
    Sgd,
    Adam,
    Adamw,
}

/// The data set a run trains on (seq2seq always trains on generated digit reversal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DatasetKind {
    /// MNIST's 28x28 digits (the four IDX files).
    Mnist,
    /// CIFAR-10, binary version: the extracted folder or the published .tar.gz.
    Cifar10,
    /// CIFAR-100 (its 100 fine classes), binary version.
    Cifar100,
    /// A folder of PNG/JPEG images, one subdirectory per class (torchvision's ImageFolder), or
    /// train/ and val/ (or test/) folders of that layout.
    Folder,
    /// Text for the GPTs: a UTF-8 file (its characters, or with --tokenizer gpt2 its GPT-2
    /// tokens; 90% trains, 10% validates), or a directory with nanoGPT's train.bin and val.bin
    /// (u16 token ids, with --tokenizer gpt2 or --vocab-size).
    Text,
}

impl DatasetKind {
    /// The directory name under the data home (`$LOCKSTEP_DATA/<name>`).
    pub fn home_name(self) -> &'static str {
        match self {
            DatasetKind::Mnist => "mnist",
            DatasetKind::Cifar10 => "cifar10",
            DatasetKind::Cifar100 => "cifar100",
            DatasetKind::Folder => "images",
            DatasetKind::Text => "text",
        }
    }
}

/// What the tokens of `--dataset text` are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TokenizerKind {
    /// The file's characters, over its own sorted character set (nanoGPT's shakespeare_char).
    Char,
    /// GPT-2's byte-pair encoding (tiktoken's `gpt2`, 50257 ids).
    Gpt2,
}

/// What --on-nan does with an inf or NaN step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnNanArg {
    /// End the run with an error that says where.
    Stop,
    /// Skip the step and go on.
    Skip,
}

/// What --on-replica-drift does when replicas' parameters differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnDriftArg {
    /// End the run with an error naming the parameter and the rank.
    Stop,
    /// Warn and give every replica rank 0's parameters.
    Rebroadcast,
}

/// What --on-checkpoint-error does when a checkpoint cannot be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnCheckpointError {
    /// End the run with the error.
    Stop,
    /// Print a warning and go on training.
    Warn,
}

/// Which parameters --weight-decay applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DecayScopeArg {
    /// Every parameter.
    All,
    /// Weight matrices and kernels only, not biases or normalisation scales.
    Weights,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LrSchedule {
    /// The learning rate stays --lr.
    Constant,
    /// From --lr down to 0 along a half cosine over the run's optimizer steps, stepped each step.
    Cosine,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StageBalance {
    /// Even parameter counts.
    Params,
    /// Even measured time: each layer's forward and backward on a micro-batch, timed on the
    /// first stage's device.
    Time,
}

#[derive(Parser, Debug, Clone)]
pub struct Args {
    /// Read flags from a TOML file whose keys are the flags' names (`batch_size = 64`,
    /// `devices = ["cpu:0", "cpu:1"]`, `headless = true`); flags on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print every flag this run would use, as a TOML file for --config, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Built-in model: mlp (784-512-512-10 on MNIST), lenet5, convnet-bn (two conv + BatchNorm
    /// blocks; both MNIST only), resnet18, resnet34, resnet50 (torchvision's; the CIFAR stem for
    /// images up to 64 pixels), or seq2seq (a GRU encoder and decoder) on generated digit
    /// reversal (5-20 digits; its accuracy is exact sequences). The ResNets' default recipe is
    /// SGD lr 0.1, momentum 0.9, weight decay 5e-4 on weights only, a linear warm-up over a
    /// fifth of the run (at most 200 steps), then cosine. Language models on --dataset text:
    /// gpt-tiny (2 layers, 2 heads, 128 wide, context 64), gpt-char (nanoGPT's
    /// shakespeare-char: 6/6/384, context 256, dropout 0.2), gpt2 (124M); their
    /// recipe is AdamW lr 1e-3, betas 0.9/0.95, weight decay 0.1 on weights only, warm-up then
    /// cosine to lr/10, gradients clipped at 1.0.
    #[arg(long, default_value = "mlp")]
    pub model: String,
    /// The data set: mnist, cifar10 or cifar100 (binary version, its folder or the published
    /// .tar.gz), folder (images by class) or text (for the GPTs). Image channels and classes,
    /// or the vocabulary, come from it.
    #[arg(long, value_enum, default_value_t = DatasetKind::Mnist)]
    pub dataset: DatasetKind,
    /// Train on the images as they are: no random crops or flips (CIFAR's training set is
    /// augmented by default with RandomCrop(32, padding=4) and RandomHorizontalFlip, a folder's
    /// with padding of an eighth of --image-size).
    #[arg(long)]
    pub no_augment: bool,
    /// --dataset folder: the side of the square every image is resized to.
    #[arg(long, default_value_t = 32, value_name = "PIXELS")]
    pub image_size: usize,
    /// --dataset folder: leave out files that do not read as images (checked by their header),
    /// with a warning each, instead of failing on them.
    #[arg(long)]
    pub skip_bad_images: bool,
    /// Language models: tokens per training window, the model's context (default: the preset's,
    /// e.g. 64 for gpt-tiny).
    #[arg(long, value_name = "TOKENS")]
    pub block_size: Option<usize>,
    /// --dataset text from train.bin/val.bin: the tokenizer's vocabulary size (GPT-2's is
    /// 50257); a character file's vocabulary is its characters, --tokenizer gpt2's is GPT-2's.
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// --dataset text: char (a file's characters are its tokens; the default for a file) or
    /// gpt2 (GPT-2's BPE: a file is tokenized once into FILE.gpt2.bin beside it, remade when the
    /// file changes; train.bin/val.bin are taken as GPT-2 ids, so `lockstep sample` decodes).
    #[arg(long, value_enum)]
    pub tokenizer: Option<TokenizerKind>,
    /// GPT: transformer blocks (default: the preset's).
    #[arg(long)]
    pub n_layer: Option<usize>,
    /// GPT: attention heads per block (default: the preset's).
    #[arg(long)]
    pub n_head: Option<usize>,
    /// GPT: the width of every token's state (default: the preset's).
    #[arg(long)]
    pub n_embd: Option<usize>,
    /// GPT: dropout on embeddings, attention weights and residual branches (default: the preset's).
    #[arg(long)]
    pub dropout: Option<f64>,
    /// ResNets and GPTs: keep only each residual or transformer block's input for backward and
    /// recompute the rest there (torch.utils.checkpoint): less memory for one more forward pass
    /// per block; the results are the same bit for bit.
    #[arg(long)]
    pub activation_checkpointing: bool,
    /// Optimizer steps of linear learning-rate warm-up before --lr-schedule (default: 0; for
    /// the GPTs a tenth of the run up to 100, for the ResNets a fifth up to 200).
    #[arg(long, value_name = "STEPS")]
    pub warmup_steps: Option<u64>,
    /// Hidden layer widths of the mlp, comma separated (default 512,512); for seq2seq, its
    /// GRUs' width (default 128).
    #[arg(long, value_delimiter = ',')]
    pub hidden: Vec<usize>,
    /// Where the data set is: for MNIST a directory with the four IDX files, for CIFAR its
    /// extracted folder, a directory holding it, or the .tar.gz. Without it:
    /// $LOCKSTEP_DATA/<mnist|cifar10|cifar100>, else the per-user cache
    /// (~/.cache/lockstep/data/mnist on Linux), downloaded there on first use.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Fetch the MNIST files (checked by SHA-256) or the CIFAR archive (by its published MD5)
    /// missing from --data DIR; without --data, missing files are fetched anyway.
    #[arg(long, conflicts_with = "no_download")]
    pub download: bool,
    /// Never download: fail when the files are missing (offline clusters).
    #[arg(long)]
    pub no_download: bool,
    /// Where downloads come from: a URL holding MNIST's four .gz files or CIFAR's archive (a
    /// mirror or a local server). Default: torchvision's MNIST mirror, the CIFAR authors' page.
    #[arg(long, value_name = "BASE", env = "LOCKSTEP_DOWNLOAD_URL")]
    pub download_url: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    #[arg(long, default_value_t = 128)]
    pub batch_size: usize,
    /// The optimizer (default: adamw for the GPTs, else sgd).
    #[arg(long, value_enum)]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate (default: 0.05 for sgd, 0.1 for the ResNets, 0.001 for adam/adamw).
    #[arg(long)]
    pub lr: Option<f64>,
    /// How the learning rate moves over the run (default: cosine for the ResNets and GPTs, else
    /// constant).
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrSchedule>,
    /// SGD momentum: the default recipe (lr 0.05, momentum 0.9) reaches about 96% on MNIST
    /// in 300 steps of the MLP; 0 is plain SGD.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay (default: 0, or 0.01 for adamw as in PyTorch, 5e-4 for the ResNets, 0.1
    /// for the GPTs).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Which parameters --weight-decay applies to (default: weights for the ResNets and GPTs,
    /// else all).
    #[arg(long, value_enum)]
    pub decay_scope: Option<DecayScopeArg>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Device: auto (a CUDA GPU, else a hardware wgpu adapter, else the CPU), cpu, cpu:N, wgpu:N, cuda:N.
    /// In a job started by `lockstep launch`, torchrun, mpirun or srun, `auto` (when it finds a
    /// GPU) and `cuda` mean cuda:LOCAL_RANK, one GPU per process; any other name is used as given
    /// by every process.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Data parallel: one replica per device (e.g. cpu:0,cpu:1), each with its shard of every
    /// global batch (--batch-size is the global batch and must divide evenly, unless the run
    /// balances: see --balance).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// With --devices: size each device's share of every global batch by its measured throughput
    /// (re-measured every --rebalance-every steps; the global batch stays --batch-size), each
    /// gradient weighted by its share so the job still learns the global batch's mean. On by
    /// default when the devices are of different kinds (e.g. cuda:0,wgpu:0,cpu); devices of one
    /// kind split evenly unless given --balance.
    #[arg(long, conflicts_with = "no_balance")]
    pub balance: bool,
    /// Split every global batch evenly even over devices of different kinds.
    #[arg(long)]
    pub no_balance: bool,
    /// In a balanced run: optimizer steps between measurements of the devices' speeds (0 keeps
    /// the initial even split).
    #[arg(long, value_name = "STEPS", default_value_t = lockstep_core::distributed::Balancer::DEFAULT_EVERY)]
    pub rebalance_every: u64,
    /// With --devices: convert every BatchNorm layer to SyncBatchNorm, whose batch statistics
    /// cover the global batch (all replicas); with one device it changes nothing.
    #[arg(long)]
    pub sync_batchnorm: bool,
    /// Data parallel: partition the optimizer state (1) and also the averaged gradients (2)
    /// over the replicas, as DeepSpeed's ZeRO stages; the weights end as without it. Replicas on
    /// threads (--devices) or processes (over MPI, or NCCL for CUDA devices).
    #[arg(long, value_name = "STAGE", value_parser = clap::value_parser!(u8).range(1..=2))]
    pub zero: Option<u8>,
    /// Print each rank's memory at its peak for this run (parameters, gradients, optimizer
    /// state, the data-parallel buckets, activations: for this model, --batch-size, --precision,
    /// --devices and --zero), measured with a few small forward and backward passes on the CPU
    /// and scaled to the batch, and exit without training.
    #[arg(long)]
    pub estimate_memory: bool,
    /// Data parallel: capacity of the gradient buckets after the first, in MiB (PyTorch's
    /// bucket_cap_mb); each full bucket is all-reduced while backward goes on.
    #[arg(long, default_value_t = 25.0)]
    pub bucket_cap_mb: f64,
    /// Data parallel: capacity of the first bucket (the first gradients ready), in MiB.
    #[arg(long, default_value_t = 1.0)]
    pub first_bucket_mb: f64,
    /// Data parallel: a collective that has not completed after SECONDS fails on every rank,
    /// naming the rank(s) it waited for (in-process and NCCL); under MPI the rank that waited
    /// ends the whole job (MPI_Abort), and mpirun names the ranks.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub collective_timeout: u64,
    /// Cap each training device's live tensors at MIB mebibytes (the CPU's, a wgpu device's),
    /// as torch.cuda.set_per_process_memory_fraction: to share a device, or to rehearse a
    /// smaller one; a tensor past it stops the run with an out-of-memory error naming the op.
    #[arg(long, value_name = "MIB")]
    pub device_memory_limit: Option<u64>,
    /// Pipeline parallel: split the model into P stages of even parameter counts, one on each of
    /// --devices (P devices), and run micro-batches through them at once.
    #[arg(long, value_name = "P", conflicts_with = "split")]
    pub pipeline_stages: Option<usize>,
    /// With --pipeline-stages: what the stages are balanced by.
    #[arg(long, value_enum, default_value_t = StageBalance::Params)]
    pub balance_stages: StageBalance,
    /// Pipeline parallel with explicit stages: layer ranges of the model's Sequential and their
    /// devices, e.g. 0-5@cpu:0,6-11@cpu:1 (every layer once, in order).
    #[arg(long, value_name = "FIRST-LAST@DEVICE,…")]
    pub split: Option<String>,
    /// Model parallel by named part (seq2seq: encoder, decoder), e.g. encoder=cpu:0,decoder=cpu:1;
    /// a range (encoder=cuda:0..3,decoder=cuda:4..7) makes data-parallel replicas of the pair.
    #[arg(long, value_name = "PART=DEVICES,…", conflicts_with_all = ["split", "pipeline_stages"])]
    pub place: Option<String>,
    /// Pipeline parallel: micro-batches each batch is cut into (1: naive model parallel, one
    /// stage working at a time).
    #[arg(long, value_name = "M", default_value_t = 4)]
    pub micro_batches: usize,
    /// Pipeline parallel: the schedule, gpipe (all forwards, then all backwards) or 1f1b
    /// (fewer activations held, the same bubble).
    #[arg(long, default_value = "1f1b")]
    pub schedule: lockstep_core::train::pipeline::ScheduleKind,
    /// Validate and test on the first N samples of the test set only.
    #[arg(long, value_name = "N")]
    pub test_samples: Option<usize>,
    /// Data loader worker threads (0 loads on the training thread).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Compute threads on the CPU (default: the cores, shared among the processes a launcher
    /// started on this machine).
    #[arg(long, default_value_t = default_threads())]
    pub threads: usize,
    /// Numeric precision: 32, 16-mixed (f16 products, loss scaling) or bf16-mixed (bf16
    /// products); parameters and optimizer state stay f32 (Lightning's names).
    #[arg(long, default_value = "32", value_parser = ["32", "16-mixed", "bf16-mixed"])]
    pub precision: String,
    /// Accumulate gradients over N batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Scale gradients down to this total 2-norm (default: 1.0 for the GPTs, else none).
    #[arg(long)]
    pub clip_grad_norm: Option<f64>,
    #[arg(long)]
    pub clip_grad_value: Option<f64>,
    #[arg(long)]
    pub no_shuffle: bool,
    /// Skip validation on the test split after each epoch.
    #[arg(long)]
    pub no_val: bool,
    #[arg(long)]
    pub limit_train_batches: Option<usize>,
    /// Log (and read the loss) every N steps.
    #[arg(long, default_value_t = 50)]
    pub log_every: u64,
    /// A step whose loss or gradients hold inf or NaN: stop the run with the step, batch and
    /// first non-finite parameter named (checked at logged steps), or skip it (every step's
    /// gradients checked, the count in the summary). 16-mixed's loss scaler skips such steps
    /// anyway.
    #[arg(long, value_enum, default_value_t = OnNanArg::Stop)]
    pub on_nan: OnNanArg,
    /// Data parallel: every N steps, compare the replicas' parameters bit for bit (devices of
    /// different vendors round differently, so a cpu+wgpu+cuda run can drift apart silently).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub check_replicas_every: Option<u64>,
    /// What a difference found by --check-replicas-every does: stop the run naming the first
    /// parameter that differs, or warn and carry on from rank 0's parameters (without
    /// --check-replicas-every nothing is compared).
    #[arg(long, value_enum, default_value_t = OnDriftArg::Stop)]
    pub on_replica_drift: OnDriftArg,
    /// A checkpoint that cannot be written (a full disk, a vanished directory): stop the run
    /// (the previous checkpoint stays whole), or warn and train on.
    #[arg(long, value_enum, default_value_t = OnCheckpointError::Stop)]
    pub on_checkpoint_error: OnCheckpointError,
    /// Write every event as a JSON line to this file.
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Write TensorBoard event files to this directory (`tensorboard --logdir DIR`): each
    /// logged step's train_loss, lr and samples_per_sec, each epoch's losses and val_acc.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Write the final summary (accuracy, loss, time, throughput) as JSON to this file.
    #[arg(long)]
    pub summary_out: Option<PathBuf>,
    /// Save last.safetensors and the best by validation accuracy here.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Also checkpoint every N optimizer steps: last.safetensors, and under --keep-checkpoints
    /// an epoch=E-step=S.safetensors (Lightning's every_n_train_steps).
    #[arg(long, value_name = "N")]
    pub checkpoint_every_n_steps: Option<u64>,
    /// Keep numbered checkpoints (epoch=E-step=S.safetensors) besides last.safetensors: all of
    /// them (Lightning's save_top_k=-1) or the newest K; written every --checkpoint-every-n-steps
    /// steps, or at every epoch end without it.
    #[arg(long, value_name = "K|all", value_parser = parse_keep)]
    pub keep_checkpoints: Option<Keep>,
    /// Continue a run from a checkpoint written with --checkpoint-dir. `--resume last` takes
    /// --checkpoint-dir's last.safetensors when a run has written one and starts from the
    /// beginning when none has (Lightning's ckpt_path="last"): what a job restarted by
    /// `lockstep launch --max-restarts` wants.
    #[arg(long, value_name = "PATH|last")]
    pub resume: Option<PathBuf>,
    /// Settings a resumed run may change on purpose: schedule, precision,
    /// accumulate_grad_batches, batch_size, world_size, seed (comma-separated), or all. Without
    /// it, --resume refuses a run that differs from the checkpoint's in any of them, naming each.
    #[arg(long, value_name = "SETTING,…|all", value_delimiter = ',')]
    pub resume_override: Vec<String>,
    /// Load PyTorch-named weights (safetensors) before training; the GPTs also take a Hugging
    /// Face transformers GPT-2 (its model.safetensors, sized with --n-layer, --n-embd, …).
    #[arg(long)]
    pub init_weights: Option<PathBuf>,
    /// No progress bar; one line per epoch (for logs and CI).
    #[arg(long)]
    pub headless: bool,
    /// Train with the dashboard window open (live curves, devices, pause / stop). Without
    /// --checkpoint-dir, checkpoints go to runs/<model>-<time>/ so a stop keeps the weights.
    #[arg(long)]
    pub dashboard: bool,
    /// With --dashboard: save a PNG of the window after SECONDS, then close it (and stop).
    #[arg(long, num_args = 2, value_names = ["SECONDS", "PATH"], requires = "dashboard")]
    pub screenshot_after: Vec<String>,
    /// For tests: every replica writes its final weights to DIR/rank<R>.safetensors.
    #[arg(long, hide = true, value_name = "DIR")]
    pub dump_weights: Option<PathBuf>,
}

fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A malformed launcher variable is reported when training starts, not here.
    let processes_here = crate::world::WorldEnv::from_env()
        .ok()
        .flatten()
        .map_or(1, |w| w.local_world_size);
    (cores / processes_here).max(1)
}

impl Args {
    /// Where the data set is read from: --data, else its per-user home.
    pub fn data_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.data {
            Some(dir) => Ok(dir.clone()),
            None => Ok(lockstep_core::data::data_home(self.dataset.home_name())?),
        }
    }
    /// Whether the model is a ResNet, whose recipe (SGD 0.1, weight decay 5e-4 on weights only,
    /// cosine) replaces the MNIST defaults for every flag not given.
    fn resnet_recipe(&self) -> bool {
        lockstep_core::models::ResNetConfig::named(&self.model).is_some()
    }
    /// Whether the model is a GPT, whose recipe (nanoGPT's: AdamW, weight decay 0.1 on weights
    /// only, warm-up and cosine, clipping at 1.0) replaces the defaults for every flag not given.
    pub fn gpt_recipe(&self) -> bool {
        lockstep_core::models::GptConfig::named(&self.model).is_some()
    }
    pub fn optimizer(&self) -> OptimizerKind {
        self.optimizer.unwrap_or(if self.gpt_recipe() {
            OptimizerKind::Adamw
        } else {
            OptimizerKind::Sgd
        })
    }
    /// Warm-up steps for a run of `steps` optimizer steps. A ResNet's SGD at lr 0.1 from the
    /// first step left `resnet18` at 98.8% on MNIST after 2 epochs; 200 steps of warm-up, 99.5%.
    pub fn warmup_steps(&self, steps: u64) -> u64 {
        self.warmup_steps.unwrap_or(if self.gpt_recipe() {
            (steps / 10).min(100)
        } else if self.resnet_recipe() {
            (steps / 5).min(200)
        } else {
            0
        })
    }
    pub fn lr_schedule(&self) -> LrSchedule {
        self.lr_schedule
            .unwrap_or(if self.resnet_recipe() || self.gpt_recipe() {
                LrSchedule::Cosine
            } else {
                LrSchedule::Constant
            })
    }
    pub fn decay_scope(&self) -> lockstep_core::optim::DecayScope {
        use lockstep_core::optim::DecayScope;
        match self.decay_scope {
            Some(DecayScopeArg::All) => DecayScope::All,
            Some(DecayScopeArg::Weights) => DecayScope::Weights,
            None if self.resnet_recipe() || self.gpt_recipe() => DecayScope::Weights,
            None => DecayScope::All,
        }
    }
    /// Whether missing files are fetched: asked for, or the default home and not refused.
    pub fn downloads(&self) -> bool {
        self.download || (self.data.is_none() && !self.no_download)
    }
    /// The flag change that would let a refused run download its data.
    pub fn how_to_download(&self) -> &'static str {
        if self.no_download {
            "run without --no-download"
        } else {
            "add --download"
        }
    }
    pub fn lr(&self) -> f64 {
        self.lr.unwrap_or(match self.optimizer() {
            OptimizerKind::Sgd if self.resnet_recipe() => 0.1,
            OptimizerKind::Sgd => 0.05,
            OptimizerKind::Adam | OptimizerKind::Adamw => 1e-3,
        })
    }
    pub fn weight_decay(&self) -> f64 {
        self.weight_decay.unwrap_or(match self.optimizer() {
            _ if self.resnet_recipe() => 5e-4,
            OptimizerKind::Adamw if self.gpt_recipe() => 0.1,
            OptimizerKind::Adamw => 0.01,
            _ => 0.0,
        })
    }
    /// Whether a multi-device run balances: --balance, or devices of different kinds (cpu, wgpu,
    /// cuda) unless --no-balance. Devices of one kind split evenly.
    pub fn balances(&self) -> bool {
        let kinds: std::collections::HashSet<&str> = self
            .devices
            .iter()
            .map(|d| d.split(':').next().unwrap_or_default())
            .collect();
        self.balance || (kinds.len() > 1 && !self.no_balance)
    }
    /// Refuses a value out of its range or flags that cannot work together, naming the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_ranges()?;
        match (self.gpt_recipe(), self.dataset == DatasetKind::Text) {
            (true, false) => anyhow::bail!(
                "{} is a language model: train it with --dataset text --data FILE (a UTF-8 text)",
                self.model
            ),
            (false, true) => anyhow::bail!(
                "--dataset text is for the language models; use --model {}",
                lockstep_core::models::gpt::NAMES.join(", --model ")
            ),
            _ => {}
        }
        anyhow::ensure!(
            self.tokenizer.is_none() || self.dataset == DatasetKind::Text,
            "--tokenizer is for --dataset text; leave it out for --dataset {}",
            format!("{:?}", self.dataset).to_lowercase()
        );
        let blocks = self.gpt_recipe() || lockstep_core::models::resnet::NAMES.contains(&self.model.as_str());
        anyhow::ensure!(
            !self.activation_checkpointing || blocks,
            "--activation-checkpointing checkpoints the blocks of the ResNets and GPTs; --model {} has none",
            self.model
        );
        let pipelined = self.pipeline_stages.is_some() || self.split.is_some() || self.place.is_some();
        let replicas = match self.pipeline_stages {
            Some(stages) if stages > 0 => (self.devices.len() / stages).max(1),
            _ if pipelined => 1,
            _ => self.devices.len().max(1),
        };
        if self.balances() {
            anyhow::ensure!(
                self.batch_size >= replicas,
                "--batch-size {} cannot give each of {replicas} devices a sample; use at least {replicas}",
                self.batch_size
            );
        } else {
            anyhow::ensure!(
                self.batch_size.is_multiple_of(replicas),
                "--batch-size {} does not split evenly over {replicas} devices; use a multiple of {replicas}",
                self.batch_size
            );
        }
        // Under a launcher each process runs one stage on its --device (the process group checks
        // the count).
        let launched = matches!(crate::world::WorldEnv::from_env(), Ok(Some(_)));
        if let Some(stages) = self.pipeline_stages.filter(|_| !launched) {
            anyhow::ensure!(
                stages > 0 && !self.devices.is_empty() && self.devices.len().is_multiple_of(stages),
                "--pipeline-stages {stages} needs {stages} devices per replica: give --devices with a multiple of {stages} names, stage by stage (stage 0's devices first); \
                 or run one stage per process: `lockstep launch --nproc-per-node {stages} -- train --pipeline-stages {stages}`"
            );
        }
        if pipelined {
            anyhow::ensure!(
                !self.estimate_memory,
                "--estimate-memory covers one device and data parallel (--devices), not pipeline stages"
            );
            anyhow::ensure!(
                !self.sync_batchnorm && !self.balance,
                "--sync-batchnorm and --balance are for data-parallel replicas, not pipeline stages"
            );
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = self.devices.iter().find(|d| !seen.insert(d.as_str())) {
            anyhow::bail!("--devices names {twice} twice; give each replica its own device");
        }
        anyhow::ensure!(
            self.epochs > 0 || self.max_steps.is_some(),
            "--epochs must be at least 1"
        );
        anyhow::ensure!(
            self.checkpoint_dir.is_some()
                || (self.checkpoint_every_n_steps.is_none() && self.keep_checkpoints.is_none()),
            "--checkpoint-every-n-steps and --keep-checkpoints need --checkpoint-dir"
        );
        anyhow::ensure!(
            self.clip_grad_norm.is_none() || self.clip_grad_value.is_none(),
            "use either --clip-grad-norm or --clip-grad-value, not both"
        );
        self.resume_overrides()?;
        anyhow::ensure!(
            !self.resumes_last() || self.checkpoint_dir.is_some(),
            "--resume last resumes from --checkpoint-dir's last.safetensors: pass --checkpoint-dir too"
        );
        // Checked before training, not at the first save an epoch later.
        if let Some(dir) = self.checkpoint_dir.as_ref().filter(|d| d.exists() && !d.is_dir()) {
            anyhow::bail!(
                "--checkpoint-dir {} is a file, not a directory; name a directory",
                dir.display()
            );
        }
        Ok(())
    }
    /// Each number within its range (`bounds`): what a typo or a hostile config file could make
    /// abort, hang or exhaust the machine is refused before anything starts.
    fn validate_ranges(&self) -> anyhow::Result<()> {
        use crate::bounds::*;
        within("--batch-size", self.batch_size, 1..=MOST_SAMPLES)?;
        threads("--threads", self.threads, 1)?;
        threads("--workers", self.workers, 0)?;
        within("--image-size", self.image_size, 1..=MOST_PIXELS)?;
        each_within("--hidden", &self.hidden, 1..=MOST_WIDTH)?;
        let optional = [
            ("--block-size", self.block_size, MOST_TOKENS),
            ("--vocab-size", self.vocab_size, MOST_VOCAB),
            ("--n-layer", self.n_layer, MOST_LAYERS),
            ("--n-head", self.n_head, MOST_LAYERS),
            ("--n-embd", self.n_embd, MOST_WIDTH),
            ("--pipeline-stages", self.pipeline_stages, MOST_PARTS),
        ];
        for (flag, value, most) in optional {
            value.map_or(Ok(()), |v| within(flag, v, 1..=most))?;
        }
        if let Some(dropout) = self.dropout {
            real("--dropout", dropout, 0.0..=0.999)?;
        }
        within("--micro-batches", self.micro_batches, 1..=MOST_PARTS)?;
        within("--accumulate", self.accumulate, 1..=MOST_PARTS)?;
        positive("--bucket-cap-mb", self.bucket_cap_mb, MOST_BUCKET_MIB)?;
        positive("--first-bucket-mb", self.first_bucket_mb, MOST_BUCKET_MIB)?;
        within("--collective-timeout", self.collective_timeout, 1..=MOST_SECONDS)?;
        if let Some(mib) = self.device_memory_limit {
            within("--device-memory-limit", mib, 1..=MOST_MEMORY_MIB)?;
        }
        within("--log-every", self.log_every, 1..=u64::MAX)?;
        positive("--lr", self.lr(), MOST_RATE)?;
        real("--momentum", self.momentum, 0.0..=1.0)?;
        real("--weight-decay", self.weight_decay(), 0.0..=MOST_RATE)?;
        if let Some(norm) = self.clip_grad_norm {
            positive("--clip-grad-norm", norm, f64::MAX)?;
        }
        if let Some(value) = self.clip_grad_value {
            positive("--clip-grad-value", value, f64::MAX)?;
        }
        if let Some(batches) = self.limit_train_batches {
            within("--limit-train-batches", batches, 1..=usize::MAX)?;
        }
        if let Some(steps) = self.max_steps {
            within("--max-steps", steps, 1..=u64::MAX)?;
        }
        if let Some(steps) = self.checkpoint_every_n_steps {
            within("--checkpoint-every-n-steps", steps, 1..=u64::MAX)?;
        }
        crate::dashboard::parse_screenshot(&self.screenshot_after)?;
        Ok(())
    }

    fn resumes_last(&self) -> bool {
        self.resume.as_ref().is_some_and(|p| p.as_os_str() == "last")
    }

    /// The checkpoint to resume from: --resume's path, or under `--resume last` the checkpoint
    /// directory's last.safetensors if a run has written one.
    /// The checkpoint to resume from: `--resume PATH`, or `last.safetensors` in the
    /// checkpoint directory of `stage` (see `checkpoint_dir_of`) where it exists.
    pub fn resume_from(&self, stage: Option<usize>) -> anyhow::Result<Option<PathBuf>> {
        let Some(path) = self.resume.as_ref() else {
            return Ok(None);
        };
        if !self.resumes_last() {
            anyhow::ensure!(
                stage.is_none(),
                "the stages of a pipeline of processes each resume their own checkpoint: give --resume last and \
                 the run's --checkpoint-dir (it holds stage-0/, stage-1/, …)"
            );
            return Ok(Some(path.clone()));
        }
        let Some(dir) = self.checkpoint_dir_of(stage) else {
            return Ok(None);
        };
        let last = dir.join("last.safetensors");
        Ok(last.exists().then_some(last))
    }

    /// `--checkpoint-dir`, or for a stage of a pipeline of processes its `stage-N/` within
    /// (each process saves its own layers, as DeepSpeed saves one file per pipeline rank).
    pub fn checkpoint_dir_of(&self, stage: Option<usize>) -> Option<PathBuf> {
        let dir = self.checkpoint_dir.as_ref()?;
        Some(match stage {
            Some(stage) => dir.join(format!("stage-{stage}")),
            None => dir.clone(),
        })
    }

    pub fn collective_timeout(&self) -> Duration {
        Duration::from_secs(self.collective_timeout)
    }
    /// The gradient buckets of a data-parallel run.
    pub fn reducer_config(&self) -> ReducerConfig {
        ReducerConfig::from_mib(self.first_bucket_mb, self.bucket_cap_mb)
    }
    /// `--resume-override`'s settings (`all`: every one).
    pub fn resume_overrides(&self) -> anyhow::Result<Vec<ResumeSetting>> {
        let mut settings = Vec::new();
        for name in &self.resume_override {
            match name.as_str() {
                "all" => settings.extend(ResumeSetting::ALL),
                one => settings.push(ResumeSetting::parse(one).map_err(|e| anyhow::anyhow!("--resume-override: {e}"))?),
            }
        }
        Ok(settings)
    }
    pub fn trainer_config(&self) -> TrainerConfig {
        TrainerConfig {
            // With --max-steps and no explicit epoch budget, run as many epochs as the steps need.
            max_epochs: if self.max_steps.is_some() && self.epochs == 1 {
                u64::MAX
            } else {
                self.epochs
            },
            max_steps: self.max_steps,
            limit_train_batches: self.limit_train_batches,
            accumulate_grad_batches: self.accumulate,
            gradient_clip: self
                .clip_grad_norm
                .map(GradientClip::Norm)
                .or(self.clip_grad_value.map(GradientClip::Value))
                .or(self.gpt_recipe().then_some(GradientClip::Norm(1.0))),
            log_every_n_steps: self.log_every,
            precision: Precision::parse(&self.precision).unwrap_or_default(),
            scheduler_interval: SchedulerInterval::Step,
            progress: if self.headless { Progress::Lines } else { Progress::Bar },
            on_nan: match self.on_nan {
                OnNanArg::Stop => OnNan::Stop,
                OnNanArg::Skip => OnNan::Skip,
            },
            replica_check: self.check_replicas_every.map(|every_n_steps| ReplicaCheck {
                every_n_steps,
                on_drift: match self.on_replica_drift {
                    OnDriftArg::Stop => OnDrift::Stop,
                    OnDriftArg::Rebroadcast => OnDrift::Rebroadcast,
                },
            }),
            // Checked by `validate`.
            resume_overrides: self.resume_overrides().unwrap_or_default(),
            zero: self.zero.and_then(|stage| ZeroStage::from_number(stage).ok()),
            ..Default::default()
        }
    }
}

/// `--keep-checkpoints`: `all` or a count of at least 1.
fn parse_keep(s: &str) -> Result<Keep, String> {
    Keep::parse(s).map_err(|e| e.to_string())
}
