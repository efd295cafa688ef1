//! The Lightning-like training loop: a `Trainer` that fits a model with an optimizer on data
//! loaders, with gradient accumulation, clipping, validation, callbacks, checkpoints with exact
//! resume, and one typed event stream that every display listens to. The loop (`fit_loop`)
//! feeds batches; a `Strategy` turns each into gradients: on one device or as a data-parallel
//! replica.

mod callbacks;
pub mod checkpoint;
mod config;
#[cfg(feature = "console")]
mod console;
mod devices;
mod evaluable;
mod events;
mod fit_loop;
mod language_task;
mod memory_estimate;
mod metrics_log;
mod numbered_checkpoints;
mod replicas;
mod resume_check;
mod seq2seq_task;
mod setup;
mod state;
mod step;
mod strategy;
mod task;
mod tensorboard;
mod trainer;

pub use callbacks::{
    Callback, CallbackAction, CallbackContext, EarlyStopping, LrMonitor, ModelCheckpoint, Monitor, OnWriteError,
};
pub use config::{GradientClip, OnNan, Precision, Progress, SchedulerInterval, TrainerConfig};
#[cfg(feature = "console")]
pub use console::ConsoleProgress;
pub use devices::SetupFactory;
pub use evaluable::Evaluable;
pub use events::{ChannelListener, DeviceStats, Event, EventListener, Record, RunInfo, StepTimes};
pub use language_task::LanguageModeling;
pub use memory_estimate::{BuildSetup, MemoryEstimate, MemoryEstimateConfig, RankMemory, estimate_memory};
pub use metrics_log::{JsonlWriter, parse_metrics_line, parse_metrics_log};
pub use numbered_checkpoints::Keep;
pub use replicas::{OnThreads, Replica, Trained, batchnorm_groups, each_replica};
pub use resume_check::{ResumeSetting, RunSettings};
pub use seq2seq_task::Seq2SeqTask;
pub use setup::TrainingSetup;
pub use state::TrainerState;
pub use step::MicroBatch;
pub use strategy::pipeline;
pub use strategy::{DataParallel, Hybrid, SingleDevice, StepReports, Strategy};
pub use task::{Classification, EvalMetrics, Task};
pub use tensorboard::TensorBoardWriter;
pub use trainer::{FitReport, Trainer};
