//! The fit / evaluate / test loops.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::callbacks::{Callback, CallbackAction, CallbackContext};
use super::checkpoint::{self, FORMAT, FORMAT_KEY};
use super::config::{GradientClip, Precision, SchedulerInterval, TrainerConfig};
use super::events::{DeviceStats, Event, EventListener, Record, RunInfo, StepTimes};
use super::replicas::{device_stats, gather_reports, replica_names};
use super::state::TrainerState;
use super::task::{EvalMetrics, Task};
use crate::autocast::AutocastGuard;
use crate::autograd::no_grad;
use crate::data::DataLoader;
use crate::device::Device;
use crate::distributed::{Balancer, Reducer, WorkDone, all_gather_values};
use crate::error::{Error, Result};
use crate::nn::{Module, ModuleExt};
use crate::optim::{LrScheduler, Optimizer, OptimizerState, SchedulerState, clip_grad_norm, clip_grad_value};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Everything the trainer drives: model, optimizer, optional scheduler, task, device, and the
/// random streams (e.g. dropout's) whose state checkpoints must carry.
pub struct TrainingSetup {
    pub model: Box<dyn Module>,
    pub optimizer: Box<dyn Optimizer>,
    pub scheduler: Option<LrScheduler>,
    pub task: Box<dyn Task>,
    pub device: Device,
    pub generators: Vec<Arc<Generator>>,
    /// A short model name for events and summaries.
    pub model_name: String,
    pub hparams: BTreeMap<String, String>,
}

/// What `fit` reports at the end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitReport {
    pub epochs: u64,
    pub steps: u64,
    pub train_seconds: f64,
    pub samples_per_sec: f64,
    /// Time the loop spent waiting for the data loader.
    pub data_wait_seconds: f64,
    pub last_train_loss: Option<f64>,
    pub last_val: Option<EvalMetrics>,
    pub stop_reason: String,
    /// A balanced run: each rank's samples of the global batch at the end, by rank.
    pub shares: Vec<usize>,
}

pub struct Trainer {
    config: TrainerConfig,
    listeners: Vec<Box<dyn EventListener>>,
    callbacks: Vec<Box<dyn Callback>>,
    state: TrainerState,
    started: Instant,
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
    /// Averages gradients with the other replicas of a data-parallel run.
    reducer: Option<Reducer>,
    /// Sizes this replica's share of each global batch by the devices' speeds.
    balancer: Option<Balancer>,
    /// Every replica's device, by rank (data parallel; set when `fit` starts).
    replica_names: Vec<String>,
}

const OPTIMIZER_PREFIX: &str = "optimizer.";

impl Trainer {
    pub fn new(config: TrainerConfig) -> Result<Trainer> {
        config.validate()?;
        Ok(Trainer {
            config,
            listeners: Vec::new(),
            callbacks: Vec::new(),
            state: TrainerState::default(),
            started: Instant::now(),
            stop: Arc::new(AtomicBool::new(false)),
            pause: Arc::new(AtomicBool::new(false)),
            reducer: None,
            balancer: None,
            replica_names: Vec::new(),
        })
    }
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }
    pub fn state(&self) -> &TrainerState {
        &self.state
    }
    /// Makes this trainer one replica of a data-parallel run: accumulation micro-batches skip
    /// communication and each optimizer step uses the gradients averaged across replicas.
    pub fn with_reducer(mut self, reducer: Reducer) -> Trainer {
        self.reducer = Some(reducer);
        self
    }
    /// Makes this replica's share of each global batch follow the devices' measured speeds
    /// (with a reducer; the training loader must cut its batches by the balancer's shares, as
    /// `ShardedBatches` does): its loss is weighted by its share, so the averaged gradient is
    /// the global batch's mean, and after each re-balance the loader starts a new iterator.
    /// Each step then waits for this device once after backward, to time its own computation.
    pub fn with_balancer(mut self, balancer: Balancer) -> Trainer {
        self.balancer = Some(balancer);
        self
    }
    pub fn add_listener(&mut self, listener: impl EventListener + 'static) {
        self.listeners.push(Box::new(listener));
    }
    pub fn add_callback(&mut self, callback: impl Callback + 'static) {
        self.callbacks.push(Box::new(callback));
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

    fn emit(&mut self, event: Event) -> Result<()> {
        let record = Record {
            t: self.started.elapsed().as_secs_f64(),
            event,
        };
        for l in &mut self.listeners {
            l.on_event(&record)?;
        }
        Ok(())
    }

    /// The state as a checkpoint stores it: position, random streams, scheduler, callbacks.
    fn snapshot(&self, setup: &TrainingSetup) -> TrainerState {
        let mut s = self.state.clone();
        s.generators = setup.generators.iter().map(|g| g.state()).collect();
        s.scheduler = setup.scheduler.as_ref().map(|sc| (sc.base_lr(), sc.last_epoch()));
        s.callbacks = self.callbacks.iter().map(|c| (c.name(), c.state())).collect();
        s.shares = self.balancer.as_ref().map(Balancer::shares).unwrap_or_default();
        s
    }

    /// Writes a checkpoint of `setup` at the current position to `path`.
    pub fn save_checkpoint(&self, setup: &TrainingSetup, path: &Path) -> Result<()> {
        write_checkpoint(path, setup, &self.snapshot(setup))
    }

    /// Restores model, optimizer, scheduler, random streams, callbacks and position from a
    /// checkpoint, so `fit` continues exactly where that run stopped.
    pub fn resume(&mut self, setup: &mut TrainingSetup, path: &Path) -> Result<()> {
        let file = checkpoint::load_tensors(path)?;
        let what = path.display().to_string();
        if file.metadata.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
            return Err(Error::data(
                what,
                "not a Lockstep checkpoint (no trainer state inside); to start from plain weights use --init-weights",
            ));
        }
        let state: TrainerState = parse_meta(&file.metadata, "lockstep.trainer_state", &what)?;
        let scalars: Vec<(String, f64)> = parse_meta(&file.metadata, "lockstep.optimizer_scalars", &what)?;
        let saved_optimizer = file.metadata.get("lockstep.optimizer").cloned().unwrap_or_default();
        if saved_optimizer != setup.optimizer.name() {
            return Err(Error::data(
                what,
                format!(
                    "it was saved with optimizer {saved_optimizer}, this run uses {}",
                    setup.optimizer.name()
                ),
            ));
        }
        let device = setup.device.clone();
        let mut model_tensors = Vec::new();
        let mut optimizer_tensors = Vec::new();
        for (name, t) in &file.tensors {
            match name.strip_prefix(OPTIMIZER_PREFIX) {
                Some(rest) => optimizer_tensors.push((
                    rest.to_string(),
                    checkpoint::host_to_device(t, t.data.dtype(), &device)?,
                )),
                None => model_tensors.push((name.clone(), checkpoint::host_to_device(t, t.data.dtype(), &device)?)),
            }
        }
        setup
            .model
            .load_state_dict(&model_tensors)
            .map_err(|e| Error::data(what.clone(), format!("does not fit this model: {e}")))?;
        setup.optimizer.load_state(&OptimizerState {
            tensors: optimizer_tensors,
            scalars,
        })?;
        if let (Some(sched), Some((base_lr, last_epoch))) = (setup.scheduler.as_mut(), state.scheduler) {
            sched.load_state(SchedulerState { base_lr, last_epoch }, setup.optimizer.as_mut())?;
        }
        if state.generators.len() != setup.generators.len() {
            return Err(Error::data(
                what,
                format!(
                    "it carries {} random streams, this run has {}",
                    state.generators.len(),
                    setup.generators.len()
                ),
            ));
        }
        for (g, &(seed, counter)) in setup.generators.iter().zip(&state.generators) {
            g.restore(seed, counter);
        }
        for c in &mut self.callbacks {
            if let Some(s) = state.callbacks.get(&c.name()) {
                c.load_state(s)?;
            }
        }
        if let Some(balancer) = &mut self.balancer {
            balancer.restore(&state.shares);
        }
        self.state = state;
        Ok(())
    }

    /// Runs the callbacks' `hook` for `epoch` (the one running, or the one that just ended),
    /// letting them save checkpoints of the current state.
    fn run_callbacks(
        &mut self,
        setup: &TrainingSetup,
        epoch: u64,
        metrics: &mut BTreeMap<String, f64>,
        hook: fn(&mut dyn Callback, &mut CallbackContext) -> Result<CallbackAction>,
    ) -> Result<CallbackAction> {
        let snapshot = self.snapshot(setup);
        let mut saved: Vec<(String, String)> = Vec::new();
        let mut saver = |path: &Path, reason: &str| -> Result<()> {
            write_checkpoint(path, setup, &snapshot)?;
            saved.push((path.display().to_string(), reason.to_string()));
            Ok(())
        };
        let mut action = CallbackAction::Continue;
        for cb in &mut self.callbacks {
            let mut ctx = CallbackContext {
                epoch,
                global_step: snapshot.global_step,
                metrics,
                saver: &mut saver,
            };
            if hook(cb.as_mut(), &mut ctx)? == CallbackAction::Stop {
                action = CallbackAction::Stop;
            }
        }
        for (path, reason) in saved {
            self.emit(Event::Checkpoint { path, reason })?;
        }
        Ok(action)
    }

    /// Trains until `max_epochs` or `max_steps`, an early stop, or a stop request.
    pub fn fit(
        &mut self,
        setup: &mut TrainingSetup,
        train: &DataLoader,
        val: Option<&DataLoader>,
    ) -> Result<FitReport> {
        let cfg = self.config.clone();
        self.started = Instant::now();
        if let Some(dtype) = cfg.precision.autocast_dtype()
            && let Err(e) = setup.device.backend().zeros(dtype, 1)
        {
            return Err(Error::invalid(
                "Trainer",
                format!(
                    "precision {} needs {dtype} on {}: {e}; choose another precision (32, 16-mixed, bf16-mixed)",
                    cfg.precision.name(),
                    setup.device
                ),
            ));
        }
        if self.balancer.is_some() && self.reducer.is_none() {
            return Err(Error::invalid(
                "Trainer",
                "a balancer weights this replica's gradient for the replicas' average: give the trainer a reducer too (with_reducer)",
            ));
        }
        if cfg.precision == Precision::Mixed16 && self.state.grad_scaler.is_none() {
            self.state.grad_scaler = Some(cfg.grad_scaler.clone().unwrap_or_default());
        }
        let steps_per_epoch = cfg.limit_train_batches.map_or(train.len(), |l| l.min(train.len())) as u64;
        self.replica_names = match &self.reducer {
            Some(r) => replica_names(r.communicator().as_ref(), &setup.device)?,
            None => Vec::new(),
        };
        let run = RunInfo {
            model: setup.model_name.clone(),
            devices: match self.replica_names.as_slice() {
                [] => vec![setup.device.location().to_string()],
                names => names.to_vec(),
            },
            max_epochs: cfg.max_epochs,
            max_steps: cfg.max_steps,
            steps_per_epoch: steps_per_epoch.div_ceil(cfg.accumulate_grad_batches as u64),
            hparams: setup.hparams.clone(),
        };
        self.emit(Event::RunStart { run })?;
        let mut data_wait = Duration::ZERO;
        let mut window = (Instant::now(), self.state.samples_seen);
        let mut report = FitReport {
            stop_reason: "max_epochs".into(),
            ..Default::default()
        };
        let run_samples_start = self.state.samples_seen;
        // Host time per phase, summed over this fit; step events report the part since the
        // last one (`logged`), the balancer the part since its last re-balance.
        let (mut times, mut logged, mut times_steps) = (StepTimes::default(), StepTimes::default(), 0u64);
        let step_limit = |s: &TrainerState| cfg.max_steps.is_some_and(|m| s.global_step >= m);
        let mut stop = step_limit(&self.state);
        // A data-parallel replica's wish to stop, until the replicas agree at a logged step.
        let mut stop_wish = false;

        while !stop && self.state.epoch < cfg.max_epochs {
            let epoch_started = Instant::now();
            setup.model.set_training(true);
            let mut batches = train.iter_from(self.state.epoch, self.state.batch_in_epoch as usize);
            let mut micro = 0usize;
            // The epoch's loss sum stays on the device; it is read once at the epoch's end.
            let mut loss_sum: Option<Tensor> = None;
            while (self.state.batch_in_epoch) < steps_per_epoch {
                let phase = Instant::now();
                let Some(batch) = batches.next() else { break };
                let tensors = batch?.to_device(&setup.device)?;
                times.data_wait += phase.elapsed().as_secs_f64();
                let phase = Instant::now();
                let n = tensors.first().map_or(0, |t| t.dims().first().copied().unwrap_or(1)) as u64;
                let loss = {
                    // The forward pass in mixed precision; backward runs outside the region.
                    let _autocast = cfg.precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
                    setup.task.loss(setup.model.as_ref(), &tensors)?
                };
                let weight = self.loss_weight();
                let mut scaled = if weight != 1.0 {
                    loss.affine(weight, 0.0)?
                } else {
                    loss.clone()
                };
                if let Some(scaler) = &self.state.grad_scaler {
                    scaled = scaler.scale_loss(&scaled)?;
                }
                times.forward += phase.elapsed().as_secs_f64();
                let phase = Instant::now();
                // Does this micro-batch end an accumulation (or the epoch)? Only that one
                // communicates (DDP's no_sync) and steps the optimizer.
                let steps_now =
                    micro + 1 >= cfg.accumulate_grad_batches || self.state.batch_in_epoch + 1 >= steps_per_epoch;
                if let Some(r) = &self.reducer {
                    r.set_sync(steps_now);
                }
                scaled.backward()?;
                if self.balancer.is_some() {
                    // This device's own compute ends here, not inside the all-reduce where
                    // waiting for the other ranks would mix in.
                    setup.device.synchronize()?;
                }
                times.backward += phase.elapsed().as_secs_f64();
                let detached = loss.detach();
                loss_sum = Some(match loss_sum {
                    Some(s) => no_grad(|| s.add(&detached))?,
                    None => detached.clone(),
                });
                self.state.epoch_loss_count += 1;
                self.state.batch_in_epoch += 1;
                self.state.samples_seen += n;
                if !steps_now {
                    micro += 1;
                    continue;
                }
                micro = 0;
                if let Some(r) = &self.reducer {
                    let phase = Instant::now();
                    r.finish()?;
                    times.communication += phase.elapsed().as_secs_f64();
                    times.all_reduce += r.last_comm_times().all_reduce;
                }
                let phase = Instant::now();
                self.optimizer_step(setup)?;
                times.optimizer += phase.elapsed().as_secs_f64();
                times_steps += 1;
                let log_step = self.state.global_step.is_multiple_of(cfg.log_every_n_steps);
                if log_step {
                    let value = detached.item()?;
                    check_finite(value, self.state.global_step)?;
                    let now = Instant::now();
                    let rate = (self.state.samples_seen - window.1) as f64 / (now - window.0).as_secs_f64().max(1e-9);
                    window = (now, self.state.samples_seen);
                    let step_times = times.since(&logged).per_step(times_steps);
                    let replicas = self.gather_replicas(&step_times, &setup.device)?;
                    let rank_times = replicas.iter().map(|(t, _)| *t).collect();
                    let event = Event::Step {
                        epoch: self.state.epoch,
                        step: self.state.global_step,
                        batch: self.state.batch_in_epoch,
                        loss: value,
                        lr: setup.optimizer.lr(),
                        samples_per_sec: rate,
                        loss_scale: self.state.grad_scaler.as_ref().map(|s| s.scale),
                        skipped_steps: self.state.skipped_steps,
                        times: Some(step_times),
                        rank_times,
                        shares: self.balancer.as_ref().map(Balancer::shares).unwrap_or_default(),
                    };
                    (logged, times_steps) = (times, 0);
                    self.emit(event)?;
                    if replicas.is_empty() {
                        let name = setup.device.location().to_string();
                        self.emit(Event::Device(device_stats(&setup.device, &name)))?;
                    }
                    for (_, stats) in replicas {
                        self.emit(Event::Device(stats))?;
                    }
                }
                if self.rebalance(&times, &setup.device)? {
                    // The rest of the epoch is cut by the new shares.
                    data_wait += batches.wait_time();
                    batches = train.iter_from(self.state.epoch, self.state.batch_in_epoch as usize);
                }
                let mut no_metrics = BTreeMap::new();
                let mut action = self.run_callbacks(setup, self.state.epoch, &mut no_metrics, |c, ctx| {
                    c.on_train_step_end(ctx)
                })?;
                let at_limit = step_limit(&self.state);
                if at_limit {
                    report.stop_reason = "max_steps".into();
                    action = CallbackAction::Stop;
                }
                while self.pause.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                if self.stop.load(Ordering::Relaxed) {
                    report.stop_reason = "stopped by request".into();
                    action = CallbackAction::Stop;
                }
                // Replicas stop together: a wish (a stop request, a callback's) waits for the
                // next logged step, where every rank's is gathered. The step limit is the same
                // on every rank and needs no agreement.
                if self.reducer.is_some() && !at_limit {
                    stop_wish |= action == CallbackAction::Stop;
                    action = match log_step && self.any_replica_stops(stop_wish, &setup.device)? {
                        true => CallbackAction::Stop,
                        false => CallbackAction::Continue,
                    };
                    if action == CallbackAction::Stop && !stop_wish {
                        report.stop_reason = "stopped by another replica".into();
                    }
                }
                if action == CallbackAction::Stop {
                    stop = true;
                    break;
                }
            }
            data_wait += batches.wait_time();
            drop(batches);
            // Fold this stretch of the epoch into the running (checkpointed) sum.
            if let Some(s) = loss_sum.take() {
                self.state.epoch_loss_sum += s.item()?;
            }
            let epoch_finished = self.state.batch_in_epoch >= steps_per_epoch;
            if !epoch_finished {
                break;
            }
            let train_loss = self.state.epoch_loss_sum / self.state.epoch_loss_count.max(1) as f64;
            check_finite(train_loss, self.state.global_step)?;
            report.last_train_loss = Some(train_loss);
            let mut metrics = BTreeMap::from([
                ("train_loss".to_string(), train_loss),
                ("lr".to_string(), setup.optimizer.lr()),
            ]);
            let validate = val.is_some() && (self.state.epoch + 1).is_multiple_of(cfg.check_val_every_n_epoch);
            let val_metrics = match (validate, val) {
                (true, Some(loader)) => Some(self.evaluate(setup, loader)?),
                _ => None,
            };
            if let Some(m) = &val_metrics {
                metrics.insert("val_loss".into(), m.loss);
                metrics.insert("val_acc".into(), m.accuracy);
            }
            self.emit(Event::Epoch {
                epoch: self.state.epoch,
                train_loss,
                val_loss: val_metrics.as_ref().map(|m| m.loss),
                val_accuracy: val_metrics.as_ref().map(|m| m.accuracy),
                lr: setup.optimizer.lr(),
                seconds: epoch_started.elapsed().as_secs_f64(),
            })?;
            report.last_val = val_metrics;
            // The next epoch starts fresh; callbacks then save a checkpoint that resumes there.
            self.state.epoch += 1;
            self.state.batch_in_epoch = 0;
            self.state.epoch_loss_sum = 0.0;
            self.state.epoch_loss_count = 0;
            if cfg.scheduler_interval == SchedulerInterval::Epoch
                && let Some(s) = setup.scheduler.as_mut()
            {
                s.step(setup.optimizer.as_mut());
            }
            // The state already points at the next epoch (so a checkpoint resumes there); the
            // callbacks are told which epoch ended.
            let ended = self.state.epoch - 1;
            let early =
                self.run_callbacks(setup, ended, &mut metrics, |c, ctx| c.on_epoch_end(ctx))? == CallbackAction::Stop;
            if self.any_replica_stops(early, &setup.device)? {
                report.stop_reason = "early stopping".into();
                stop = true;
            }
        }
        let mut no_metrics = BTreeMap::new();
        let epoch = self.state.epoch;
        self.run_callbacks(setup, epoch, &mut no_metrics, |c, ctx| {
            c.on_train_end(ctx).map(|_| CallbackAction::Continue)
        })?;
        let seconds = self.started.elapsed().as_secs_f64();
        report.epochs = self.state.epoch;
        report.steps = self.state.global_step;
        report.train_seconds = seconds;
        report.samples_per_sec = (self.state.samples_seen - run_samples_start) as f64 / seconds.max(1e-9);
        report.data_wait_seconds = data_wait.as_secs_f64();
        report.shares = self.balancer.as_ref().map(Balancer::shares).unwrap_or_default();
        self.emit(Event::RunEnd {
            epochs: report.epochs,
            steps: report.steps,
            seconds,
            samples_per_sec: report.samples_per_sec,
            data_wait_seconds: report.data_wait_seconds,
            reason: report.stop_reason.clone(),
        })?;
        Ok(report)
    }

    /// What this micro-batch's loss is multiplied by before backward: 1/K over K accumulated
    /// micro-batches, times the balancer's weight for this replica's share. Weighting the loss,
    /// not the gradients in the reducer's buckets, costs no pass over the gradients and also
    /// weights what flows to other replicas through SyncBatchNorm's all-reduces.
    fn loss_weight(&self) -> f64 {
        let share = self.balancer.as_ref().map_or(1.0, Balancer::gradient_weight);
        share / self.config.accumulate_grad_batches as f64
    }

    /// After an optimizer step: lets the balancer measure it and maybe re-balance; true when
    /// the shares changed.
    fn rebalance(&mut self, times: &StepTimes, device: &Device) -> Result<bool> {
        let Some(balancer) = &mut self.balancer else {
            return Ok(false);
        };
        let done = WorkDone {
            samples: self.state.samples_seen,
            compute_seconds: times.compute(),
        };
        balancer.after_step(self.state.global_step, done, device)
    }

    /// Whether to stop: `mine` on a single device; in a data-parallel run, whether any replica
    /// wishes to (every rank gathers every wish), so all stop at the same step. A replica that
    /// stopped alone would leave the others waiting in their next all-reduce (Lightning reduces
    /// its `should_stop` across ranks the same way).
    fn any_replica_stops(&self, mine: bool, device: &Device) -> Result<bool> {
        let Some(reducer) = &self.reducer else {
            return Ok(mine);
        };
        let wishes = all_gather_values(reducer.communicator().as_ref(), device, vec![f32::from(u8::from(mine))])?;
        Ok(wishes.iter().any(|&w| w > 0.0))
    }

    /// Every replica's step times and device counters, by rank (empty on a single device).
    /// Every rank takes part; the communication thread is idle here, after `finish`.
    fn gather_replicas(&self, mine: &StepTimes, device: &Device) -> Result<Vec<(StepTimes, DeviceStats)>> {
        match &self.reducer {
            Some(r) => gather_reports(r.communicator().as_ref(), device, mine, &self.replica_names),
            None => Ok(Vec::new()),
        }
    }

    /// Unscale (mixed precision), clip, step (unless a gradient is inf/NaN), zero the gradients,
    /// advance the per-step scheduler.
    fn optimizer_step(&mut self, setup: &mut TrainingSetup) -> Result<()> {
        // Unscaled once per optimizer step, before clipping; with DDP the gradients are already
        // averaged, so every rank reaches the same verdict.
        let finite = match &self.state.grad_scaler {
            Some(scaler) => scaler.unscale(setup.optimizer.parameters())?,
            None => true,
        };
        if let Some(scaler) = &mut self.state.grad_scaler {
            scaler.update(finite);
        }
        if finite {
            no_grad(|| -> Result<()> {
                match self.config.gradient_clip {
                    Some(GradientClip::Norm(max)) => {
                        clip_grad_norm(setup.optimizer.parameters(), max, 2.0)?;
                    }
                    Some(GradientClip::Value(v)) => clip_grad_value(setup.optimizer.parameters(), v)?,
                    None => {}
                }
                setup.optimizer.step()
            })?;
        } else {
            self.state.skipped_steps += 1;
        }
        setup.optimizer.zero_grad();
        self.state.global_step += 1;
        if self.config.scheduler_interval == SchedulerInterval::Step
            && let Some(s) = setup.scheduler.as_mut()
        {
            s.step(setup.optimizer.as_mut());
        }
        Ok(())
    }

    /// Mean loss and accuracy over a loader, in evaluation mode and without the graph.
    pub fn evaluate(&mut self, setup: &mut TrainingSetup, loader: &DataLoader) -> Result<EvalMetrics> {
        setup.model.set_training(false);
        let precision = self.config.precision;
        let result = no_grad(|| -> Result<EvalMetrics> {
            let _autocast = precision.autocast_dtype().map(AutocastGuard::new).transpose()?;
            let mut sums: Option<(Tensor, Tensor)> = None;
            let mut samples = 0u64;
            for batch in loader.iter(0) {
                let tensors = batch?.to_device(&setup.device)?;
                samples += tensors.first().map_or(0, |t| t.dims().first().copied().unwrap_or(1)) as u64;
                let (loss, correct) = setup.task.eval_sums(setup.model.as_ref(), &tensors)?;
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
        setup.model.set_training(true);
        result
    }

    /// Evaluates on a test loader and emits the result.
    pub fn test(&mut self, setup: &mut TrainingSetup, loader: &DataLoader) -> Result<EvalMetrics> {
        let m = self.evaluate(setup, loader)?;
        self.emit(Event::Test {
            loss: m.loss,
            accuracy: m.accuracy,
            samples: m.samples,
        })?;
        Ok(m)
    }
}

fn check_finite(loss: f64, step: u64) -> Result<()> {
    if loss.is_finite() {
        return Ok(());
    }
    Err(Error::invalid(
        "Trainer",
        format!(
            "the loss became {loss} at step {step}: training diverged; lower the learning rate, enable gradient clipping (--clip-grad-norm), or check the data for NaN/inf"
        ),
    ))
}

fn parse_meta<T: serde::de::DeserializeOwned>(meta: &BTreeMap<String, String>, key: &str, what: &str) -> Result<T> {
    let raw = meta
        .get(key)
        .ok_or_else(|| Error::data(what.to_string(), format!("metadata `{key}` is missing")))?;
    serde_json::from_str(raw).map_err(|e| Error::data(what.to_string(), format!("metadata `{key}` is unreadable: {e}")))
}

/// One checkpoint file: model tensors by PyTorch name, optimizer tensors under `optimizer.`,
/// and the trainer state, optimizer scalars and optimizer name as metadata.
fn write_checkpoint(path: &Path, setup: &TrainingSetup, state: &TrainerState) -> Result<()> {
    let mut tensors = setup.model.state_dict();
    let opt = setup.optimizer.state();
    tensors.extend(
        opt.tensors
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t.clone())),
    );
    let json = |v: &dyn erased::Json| v.to_json();
    let meta = BTreeMap::from([
        (FORMAT_KEY.to_string(), FORMAT.to_string()),
        ("lockstep.trainer_state".to_string(), json(state)),
        ("lockstep.optimizer_scalars".to_string(), json(&opt.scalars)),
        ("lockstep.optimizer".to_string(), setup.optimizer.name().to_string()),
    ]);
    checkpoint::save_tensors(path, &tensors, meta)
}

mod erased {
    /// Serialises to a JSON string (a serialisation failure here would be a bug in our types).
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|e| format!("\"unserialisable: {e}\""))
        }
    }
}
