//! The Lightning-like training loop: a `Trainer` that fits a model with an optimizer on data
//! loaders, with gradient accumulation, clipping, validation, callbacks, checkpoints with exact
//! resume, and one typed event stream that every display listens to.

mod callbacks;
pub mod checkpoint;
mod config;
mod events;
mod metrics_log;
mod replicas;
mod state;
mod task;
mod trainer;

pub use callbacks::{Callback, CallbackAction, CallbackContext, EarlyStopping, LrMonitor, ModelCheckpoint, Monitor};
pub use config::{GradientClip, Precision, SchedulerInterval, TrainerConfig};
pub use events::{ChannelListener, DeviceStats, Event, EventListener, Record, RunInfo, StepTimes};
pub use metrics_log::JsonlWriter;
pub use state::TrainerState;
pub use task::{Classification, EvalMetrics, Task};
pub use trainer::{FitReport, Trainer, TrainingSetup};
