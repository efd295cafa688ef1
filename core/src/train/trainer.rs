//! The trainer: its configuration, listeners, callbacks, strategy and position; checkpoints,
//! and the evaluate and test loops (`fit` is in `fit_loop.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::callbacks::{Callback, CallbackAction, CallbackContext};
use super::checkpoint::{self, TensorFile};
use super::config::TrainerConfig;
use super::devices::Devices;
use super::evaluable::Evaluable;
use super::events::{Event, EventListener, Record};
use super::resume_check::PendingResume;
use super::setup::TrainingSetup;
use super::state::TrainerState;
use super::strategy::{SingleDevice, Strategy};
use super::task::EvalMetrics;
use crate::autocast::AutocastGuard;
use crate::autograd::no_grad;
use crate::data::DataLoader;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What `fit` reports at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitReport {
    /// Epochs completed, counting those before a resume.
    pub epochs: u64,
    /// Optimizer steps taken, counting those before a resume.
    pub steps: u64,
    /// Wall-clock seconds of this `fit` call.
    pub train_seconds: f64,
    /// Wall-clock seconds of each epoch this call completed, validation included (the first also
    /// holds the warm-up: kernels loaded, algorithms chosen, memory pools grown).
    pub epoch_seconds: Vec<f64>,
    /// Training samples per second over this `fit` call (summed over the replicas by
    /// `DataParallel::on_threads`).
    pub samples_per_sec: f64,
    /// Time the loop spent waiting for the data loader.
    pub data_wait_seconds: f64,
    /// The last completed epoch's mean training loss; `None` if no epoch ended.
    pub last_train_loss: Option<f64>,
    /// The last completed epoch's validation metrics; `None` if that epoch did not validate.
    pub last_val: Option<EvalMetrics>,
    /// Why training stopped: `max_epochs`, `max_steps`, `early stopping`, `stopped by request` or
    /// `stopped by another replica`.
    pub stop_reason: String,
    /// Optimizer steps skipped for inf/NaN gradients (`OnNan::Skip`, or mixed precision's loss
    /// scaler), counting those before a resume.
    pub skipped_steps: u64,
    /// A balanced run: each rank's samples of the global batch at the end, by rank.
    pub shares: Vec<usize>,
    /// The bytes of optimizer state each worker held at the end, by rank as far as this
    /// process knows them (every replica with `Trainer::devices`; this one under a launcher).
    /// With ZeRO each is a share, about 1/N of the whole.
    pub optimizer_state_bytes: Vec<u64>,
}

/// Lightning's `Trainer`: fits a `TrainingSetup` on data loaders with a `Strategy`, emits events to
/// listeners, runs callbacks, and saves and resumes checkpoints.
pub struct Trainer {
    pub(super) config: TrainerConfig,
    pub(super) listeners: Vec<Box<dyn EventListener>>,
    /// The progress view `config.progress` asks for; rank 0's only, in data parallel.
    console: Option<Box<dyn EventListener>>,
    pub(super) callbacks: Vec<Box<dyn Callback>>,
    pub(super) state: TrainerState,
    pub(super) started: Instant,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) pause: Arc<AtomicBool>,
    /// How each batch becomes a loss and gradients: one device, or a data-parallel replica.
    pub(super) strategy: Box<dyn Strategy>,
    /// The name of the first callback that asked to stop, for the report's stop reason.
    pub(super) stopped_by: Option<String>,
    /// A checkpoint `resume` loaded, whose run `fit` compares with this one before it starts.
    pub(super) pending_resume: Option<PendingResume>,
    /// The devices `fit` trains on, where more than the setup's own (`devices`).
    pub(super) devices: Option<Devices>,
    /// With `devices`: BatchNorm over the global batch (`sync_batchnorm`).
    pub(super) sync_batchnorm: bool,
}

impl Trainer {
    /// A trainer on the setup's one device (`SingleDevice`) that prints progress as
    /// `config.progress` says; an error if `config` fails `TrainerConfig::validate`.
    pub fn new(config: TrainerConfig) -> Result<Trainer> {
        config.validate()?;
        #[cfg(feature = "console")]
        let console = (config.progress != super::Progress::Off)
            .then(|| Box::new(super::ConsoleProgress::new(config.progress)) as Box<dyn EventListener>);
        #[cfg(not(feature = "console"))]
        let console = None;
        Ok(Trainer {
            config,
            listeners: Vec::new(),
            console,
            callbacks: Vec::new(),
            state: TrainerState::default(),
            started: Instant::now(),
            stop: Arc::new(AtomicBool::new(false)),
            pause: Arc::new(AtomicBool::new(false)),
            strategy: Box::new(SingleDevice),
            stopped_by: None,
            pending_resume: None,
            devices: None,
            sync_batchnorm: false,
        })
    }
    /// The configuration it runs with.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }
    /// Its position in the run (epoch, batch, global step), as checkpoints store it.
    pub fn state(&self) -> &TrainerState {
        &self.state
    }
    /// Trains with `strategy` (e.g. `DataParallel`) instead of on the setup's one device; a
    /// replica other than rank 0 then prints no progress.
    pub fn with_strategy(mut self, strategy: impl Strategy + 'static) -> Trainer {
        if strategy.rank() != 0 {
            self.console = None;
        }
        self.strategy = Box::new(strategy);
        self
    }
    /// Trains on `devices`, one replica each, their gradients averaged after every backward
    /// pass (PyTorch's DDP; Lightning's `Trainer(devices=…)`): the setup given to `fit` is rank
    /// 0, on the first device, and `build` (the function that made it) makes each further
    /// replica on its device, on a thread of its own. The training loader's batch is the global
    /// batch, split evenly; only rank 0 validates, and this trainer's listeners and callbacks
    /// see rank 0's run. One device trains as without it.
    pub fn devices(
        mut self,
        devices: Vec<Device>,
        build: impl Fn(&Device) -> Result<TrainingSetup> + Send + Sync + 'static,
    ) -> Trainer {
        self.devices = Some(Devices {
            list: devices,
            build: Arc::new(build),
        });
        self
    }
    /// With `devices`: BatchNorm layers normalise over the global batch, every replica's
    /// samples together (PyTorch's `SyncBatchNorm`); then a run on several devices follows the
    /// one-device run up to summation order. The setup given to `fit` keeps the conversion.
    pub fn sync_batchnorm(mut self, sync: bool) -> Trainer {
        self.sync_batchnorm = sync;
        self
    }
    /// Sends every event from now on to `listener`, after the listeners added before.
    pub fn add_listener(&mut self, listener: impl EventListener + 'static) {
        self.listeners.push(Box::new(listener));
    }
    /// Adds a callback; each hook runs the callbacks in the order they were added.
    pub fn add_callback(&mut self, callback: impl Callback + 'static) {
        self.callbacks.push(Box::new(callback));
    }
    /// The first callback of type `T`, to ask it things after `fit` (a `ModelCheckpoint`'s
    /// `best()`, say).
    pub fn callback<T: Callback + 'static>(&self) -> Option<&T> {
        self.callbacks
            .iter()
            .find_map(|c| c.as_ref().as_any().downcast_ref::<T>())
    }
    /// Set it (from another thread, a signal handler or a UI) to stop after the current step;
    /// callbacks then save their checkpoints as at any end of training.
    pub fn stop_handle(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Set it to hold training after the current step until it is cleared (or a stop arrives).
    pub fn pause_handle(&self) -> Arc<AtomicBool> {
        self.pause.clone()
    }

    /// Uses flags the caller already holds (a UI's stop and pause buttons) as this trainer's
    /// `stop_handle` and `pause_handle`.
    pub fn with_controls(mut self, stop: Arc<AtomicBool>, pause: Arc<AtomicBool>) -> Trainer {
        self.stop = stop;
        self.pause = pause;
        self
    }

    pub(super) fn emit(&mut self, event: Event) -> Result<()> {
        let record = Record {
            t: self.started.elapsed().as_secs_f64(),
            event,
        };
        for l in self.console.iter_mut().chain(&mut self.listeners) {
            l.on_event(&record)?;
        }
        Ok(())
    }

    /// The state as a checkpoint stores it: position, random streams, scheduler, callbacks.
    fn snapshot(&self, setup: &TrainingSetup) -> TrainerState {
        let mut s = self.state.clone();
        s.generators = setup.random_streams().iter().map(|g| g.state()).collect();
        s.scheduler = setup.scheduler.as_ref().map(|sc| (sc.base_lr(), sc.last_epoch()));
        s.callbacks = self.callbacks.iter().map(|c| (c.name(), c.state())).collect();
        s.shares = self.strategy.shares();
        s
    }

    /// Writes a checkpoint of `setup` at the current position to `path`.
    pub fn save_checkpoint(&self, setup: &TrainingSetup, path: &Path) -> Result<()> {
        checkpoint::training::write(path, setup, &self.snapshot(setup))
    }

    /// Restores model, optimizer, scheduler, random streams, callbacks and position from a
    /// checkpoint, so `fit` continues exactly where that run stopped. `fit` then refuses to
    /// start if this run's schedule, precision, accumulation, global batch, world size or seeds
    /// differ from the checkpoint's (naming each; `TrainerConfig::resume_overrides` accepts
    /// changes on purpose), and its events say where it resumed from.
    pub fn resume(&mut self, setup: &mut TrainingSetup, path: &Path) -> Result<()> {
        let file = checkpoint::load_tensors(path)?;
        self.resume_from(setup, &file, &path.display().to_string())
    }

    /// As [`resume`](Trainer::resume), from a checkpoint already read (e.g. by
    /// [`checkpoint::parse_tensors`] from bytes that are not in a file), named `what` in errors.
    pub fn resume_from(&mut self, setup: &mut TrainingSetup, file: &TensorFile, what: &str) -> Result<()> {
        // Taken before the checkpoint's streams replace them, for `fit` to compare.
        let seeds = setup.random_streams().iter().map(|g| g.seed()).collect();
        let state = checkpoint::training::restore(setup, file, what)?;
        for c in &mut self.callbacks {
            if let Some(s) = state.callbacks.get(&c.name()) {
                c.load_state(s)?;
            }
        }
        self.strategy.restore_shares(&state.shares);
        self.state = state;
        self.pending_resume = Some(PendingResume {
            path: what.to_string(),
            seeds,
        });
        Ok(())
    }

    /// Runs the callbacks' `hook` for `epoch` (the one running, or the one that just ended),
    /// letting them save checkpoints of the current state.
    pub(super) fn run_callbacks(
        &mut self,
        setup: &TrainingSetup,
        epoch: u64,
        metrics: &mut BTreeMap<String, f64>,
        hook: fn(&mut dyn Callback, &mut CallbackContext) -> Result<CallbackAction>,
    ) -> Result<CallbackAction> {
        let snapshot = self.snapshot(setup);
        let mut saved: Vec<(String, String)> = Vec::new();
        let mut saver = |path: &Path, reason: &str| -> Result<()> {
            checkpoint::training::write(path, setup, &snapshot)?;
            saved.push((path.display().to_string(), reason.to_string()));
            Ok(())
        };
        self.strategy.callbacks_start()?;
        let mut action = Ok(CallbackAction::Continue);
        for cb in &mut self.callbacks {
            let mut ctx = CallbackContext {
                epoch,
                global_step: snapshot.global_step,
                metrics,
                saver: &mut saver,
            };
            match hook(cb.as_mut(), &mut ctx) {
                Ok(CallbackAction::Stop) => {
                    action = Ok(CallbackAction::Stop);
                    self.stopped_by.get_or_insert_with(|| cb.name());
                }
                Ok(CallbackAction::Continue) => {}
                Err(e) => {
                    action = Err(e);
                    break;
                }
            }
        }
        // Also after a failed callback: the other workers wait for it.
        self.strategy.callbacks_done()?;
        let action = action?;
        for (path, reason) in saved {
            self.emit(Event::Checkpoint { path, reason })?;
        }
        Ok(action)
    }

    /// Mean loss and accuracy over a loader, in evaluation mode and without the graph: of a
    /// `TrainingSetup`, or of a model alone (see [`Evaluable`]).
    pub fn evaluate(&mut self, target: &mut impl Evaluable, loader: &DataLoader) -> Result<EvalMetrics> {
        target.set_training(false);
        let precision = self.config.precision;
        let device = target.device();
        let strategy = self.strategy.as_ref();
        let scored = &*target;
        let result = no_grad(|| -> Result<EvalMetrics> {
            let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
            let mut sums: Option<(Tensor, Tensor)> = None;
            let mut samples = 0u64;
            for batch in loader.iter(0) {
                let tensors = batch?.to_device(&device)?;
                samples += tensors.first().map_or(0, |t| t.dims().first().copied().unwrap_or(1)) as u64;
                let (loss, correct) = scored.eval_sums(strategy, &tensors)?;
                sums = Some(match sums {
                    Some((l, c)) => (l.add(&loss)?, c.add(&correct)?),
                    None => (loss, correct),
                });
            }
            let (loss, correct) = match sums {
                Some((l, c)) => (l.item()?, c.item()?),
                None => return Err(Error::invalid("evaluate", "the evaluation loader yielded no batches")),
            };
            Ok(EvalMetrics {
                loss: loss / samples.max(1) as f64,
                accuracy: correct / samples.max(1) as f64,
                samples,
            })
        });
        target.set_training(true);
        result
    }

    /// Lightning's `trainer.validate`: the metrics of a setup or of a model alone (a loaded
    /// one, with no optimizer) on a validation loader.
    pub fn validate(&mut self, target: &mut impl Evaluable, loader: &DataLoader) -> Result<EvalMetrics> {
        self.evaluate(target, loader)
    }

    /// Evaluates a setup or a model alone (a loaded one, with no optimizer) on a test loader
    /// and emits the result, as Lightning's `trainer.test`.
    pub fn test(&mut self, target: &mut impl Evaluable, loader: &DataLoader) -> Result<EvalMetrics> {
        let m = self.evaluate(target, loader)?;
        self.emit(Event::Test {
            loss: m.loss,
            accuracy: m.accuracy,
            samples: m.samples,
        })?;
        Ok(m)
    }
}

#[cfg(all(test, feature = "console"))]
mod tests {
    use super::*;
    use crate::train::Progress;

    #[test]
    fn a_trainer_prints_its_progress_unless_told_not_to() {
        let default = Trainer::new(TrainerConfig::default()).unwrap();
        assert!(default.console.is_some(), "Lightning's default: a progress view");
        let quiet = Trainer::new(TrainerConfig {
            progress: Progress::Off,
            ..Default::default()
        })
        .unwrap();
        assert!(quiet.console.is_none());
    }

    #[test]
    fn only_rank_0_of_a_data_parallel_run_prints() {
        use crate::backend::LocalCommunicator;
        use crate::distributed::{Reducer, ReducerConfig};
        use crate::train::DataParallel;

        let device = crate::Device::cpu();
        let weight = Tensor::zeros([2], crate::DType::F32, &device).unwrap();
        let comms = LocalCommunicator::group(vec![device.backend().clone(), device.backend().clone()]);
        // Making a reducer broadcasts rank 0's weights: the ranks make theirs side by side.
        let consoles: Vec<bool> = std::thread::scope(|scope| {
            let handles: Vec<_> = comms
                .into_iter()
                .map(|comm| {
                    let weight = weight.clone();
                    scope.spawn(move || {
                        let reducer = Reducer::new(&[weight], Arc::new(comm), ReducerConfig::default()).unwrap();
                        let strategy = DataParallel::new(reducer);
                        Trainer::new(TrainerConfig::default())
                            .unwrap()
                            .with_strategy(strategy)
                            .console
                            .is_some()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(consoles, [true, false]);
    }
}
