//! `Trainer::fit`: epochs of batches, accumulation, optimizer steps, step and epoch events,
//! validation, callbacks, pause and stop. How each batch becomes gradients is the strategy's.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::TrainingSetup;
use super::callbacks::CallbackAction;
use super::config::{OnNan, Precision, SchedulerInterval};
use super::events::{Event, RunInfo, StepTimes};
use super::step::{self, MicroBatch};
use super::trainer::{FitReport, Trainer};
use crate::autograd::no_grad;
use crate::data::DataLoader;
use crate::error::Result;
use crate::tensor::Tensor;

/// What one `fit` tracks beside the checkpointed `TrainerState`.
struct FitProgress {
    /// Host time per phase, summed over this fit; step events report the part since `logged`,
    /// averaged over `steps_since_log`.
    times: StepTimes,
    logged: StepTimes,
    steps_since_log: u64,
    /// (when, samples seen) at the last logged step, for its throughput.
    window: (Instant, u64),
    data_wait: Duration,
    /// A wish to stop of a worker that must stop with the others, until they agree.
    stop_wish: bool,
    report: FitReport,
}

impl Trainer {
    /// Trains until `max_epochs` or `max_steps`, an early stop, or a stop request.
    pub fn fit(
        &mut self,
        setup: &mut TrainingSetup,
        train: &DataLoader,
        val: Option<&DataLoader>,
    ) -> Result<FitReport> {
        if let Some(devices) = self.devices.take_if(|d| d.list.len() > 1) {
            let report = self.fit_on_devices(&devices, setup, train, val);
            self.devices = Some(devices);
            return report;
        }
        let cfg = self.config.clone();
        self.started = Instant::now();
        // Before the strategy's setup: every replica refuses alike, before any collective.
        let resumed = self.check_resume(setup, train)?;
        let devices = self.strategy.setup(setup, &cfg)?;
        if cfg.precision == Precision::Mixed16 && self.state.grad_scaler.is_none() {
            self.state.grad_scaler = Some(cfg.grad_scaler.clone().unwrap_or_default());
        }
        let steps_per_epoch = cfg.limit_train_batches.map_or(train.len(), |l| l.min(train.len())) as u64;
        let run = RunInfo {
            model: setup.model_name.clone(),
            devices,
            max_epochs: cfg.max_epochs,
            max_steps: cfg.max_steps,
            steps_per_epoch: steps_per_epoch.div_ceil(cfg.accumulate_grad_batches as u64),
            hparams: setup.hparams.clone(),
        };
        self.emit(Event::RunStart { run })?;
        if let Some(event) = resumed {
            self.emit(event)?;
        }
        let samples_at_start = self.state.samples_seen;
        let mut progress = FitProgress {
            times: StepTimes::default(),
            logged: StepTimes::default(),
            steps_since_log: 0,
            window: (Instant::now(), samples_at_start),
            data_wait: Duration::ZERO,
            stop_wish: false,
            report: FitReport {
                stop_reason: "max_epochs".into(),
                ..Default::default()
            },
        };
        let mut stop = self.at_step_limit();
        while !stop && self.state.epoch < cfg.max_epochs {
            let epoch_started = Instant::now();
            stop = self.train_epoch(setup, train, steps_per_epoch, &mut progress)?;
            if self.state.batch_in_epoch < steps_per_epoch {
                break;
            }
            // Every worker takes part in the epoch's end, whatever it wished.
            stop |= self.end_epoch(setup, val, epoch_started, &mut progress)?;
        }
        let mut no_metrics = BTreeMap::new();
        let epoch = self.state.epoch;
        self.run_callbacks(setup, epoch, &mut no_metrics, |c, ctx| {
            c.on_train_end(ctx).map(|_| CallbackAction::Continue)
        })?;
        let optimizer_state_bytes = self.strategy.optimizer_state_bytes(setup);
        self.strategy.after_fit(setup)?;
        let seconds = self.started.elapsed().as_secs_f64();
        let mut report = progress.report;
        report.epochs = self.state.epoch;
        report.steps = self.state.global_step;
        report.skipped_steps = self.state.skipped_steps;
        report.train_seconds = seconds;
        report.samples_per_sec = (self.state.samples_seen - samples_at_start) as f64 / seconds.max(1e-9);
        report.data_wait_seconds = progress.data_wait.as_secs_f64();
        report.shares = self.strategy.shares();
        report.optimizer_state_bytes = vec![optimizer_state_bytes];
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

    fn at_step_limit(&self) -> bool {
        self.config.max_steps.is_some_and(|m| self.state.global_step >= m)
    }

    /// The rest of the current epoch's batches, or until a stop; true when training stops.
    fn train_epoch(
        &mut self,
        setup: &mut TrainingSetup,
        train: &DataLoader,
        steps_per_epoch: u64,
        progress: &mut FitProgress,
    ) -> Result<bool> {
        setup.model.set_training(true);
        let accumulate = self.config.accumulate_grad_batches;
        let mut batches = train.iter_from(self.state.epoch, self.state.batch_in_epoch as usize);
        let mut micro = 0usize;
        // The epoch's loss sum stays on the device; it is read once at the epoch's end. A step's
        // micro-batch losses join it when the step is taken (a skipped inf/NaN step's do not).
        let mut loss_sum: Option<Tensor> = None;
        let mut step_losses: Option<Tensor> = None;
        let mut stop = false;
        while self.state.batch_in_epoch < steps_per_epoch {
            let phase = Instant::now();
            let Some(batch) = batches.next() else { break };
            let tensors = self.strategy.batch_to_device(setup, &batch?)?;
            progress.times.data_wait += phase.elapsed().as_secs_f64();
            let micro_batch = MicroBatch {
                tensors: &tensors,
                weight: 1.0 / accumulate as f64,
                precision: self.config.precision,
                scaler: self.state.grad_scaler.as_ref(),
                // Only the micro-batch that ends an accumulation (or the epoch) communicates
                // and steps the optimizer.
                ends_step: micro + 1 >= accumulate || self.state.batch_in_epoch + 1 >= steps_per_epoch,
            };
            let loss = self
                .strategy
                .forward_backward(setup, &micro_batch, &mut progress.times)?;
            step_losses = Some(match step_losses {
                Some(s) => no_grad(|| s.add(&loss))?,
                None => loss.clone(),
            });
            self.state.batch_in_epoch += 1;
            self.state.samples_seen += micro_batch.samples();
            if !micro_batch.ends_step {
                micro += 1;
                continue;
            }
            let micro_batches_in_step = micro as u64 + 1;
            micro = 0;
            self.strategy.finish_gradients(setup, &mut progress.times)?;
            let phase = Instant::now();
            let stepped = step::optimizer_step(&self.config, &mut self.state, setup, self.strategy.as_ref())?;
            progress.times.optimizer += phase.elapsed().as_secs_f64();
            // Only a step skipped by choice (`OnNan::Skip`) leaves its loss out; mixed
            // precision's skipped overflow steps count as they always did.
            let counted = stepped || self.config.on_nan == OnNan::Stop;
            let losses = step_losses.take();
            if counted {
                loss_sum = match (loss_sum, losses) {
                    (Some(s), Some(l)) => Some(no_grad(|| s.add(&l))?),
                    (s, l) => s.or(l),
                };
                self.state.epoch_loss_count += micro_batches_in_step;
            }
            progress.steps_since_log += 1;
            let logged = self.state.global_step.is_multiple_of(self.config.log_every_n_steps);
            if logged {
                self.log_step(setup, &loss, counted, progress)?;
            }
            if self
                .strategy
                .after_optimizer_step(setup, &self.state, &progress.times)?
            {
                // The rest of the epoch is cut by the new shares.
                progress.data_wait += batches.wait_time();
                batches = train.iter_from(self.state.epoch, self.state.batch_in_epoch as usize);
            }
            if self.step_stops(setup, logged, progress)? {
                stop = true;
                break;
            }
        }
        progress.data_wait += batches.wait_time();
        drop(batches);
        // Fold this stretch of the epoch into the running (checkpointed) sum, every worker's
        // parts together (workers stop together, so all arrive here).
        if let Some(s) = loss_sum {
            self.state.epoch_loss_sum += self.strategy.sum_over_workers(setup, &s)?.item()?;
        }
        Ok(stop)
    }

    /// The step event (loss, rate, phase times, every worker's) and the devices' counters.
    /// A step skipped by `OnNan::Skip` (not `counted`) logs its loss, whatever it is.
    fn log_step(
        &mut self,
        setup: &TrainingSetup,
        loss: &Tensor,
        counted: bool,
        progress: &mut FitProgress,
    ) -> Result<()> {
        let value = self.strategy.sum_over_workers(setup, loss)?.item()?;
        if counted {
            step::check_finite(value, &self.state, setup)?;
        }
        let now = Instant::now();
        let samples = self.state.samples_seen - progress.window.1;
        let rate = samples as f64 / (now - progress.window.0).as_secs_f64().max(1e-9);
        progress.window = (now, self.state.samples_seen);
        let step_times = progress
            .times
            .since(&progress.logged)
            .per_step(progress.steps_since_log);
        let reports = self.strategy.step_reports(setup, &step_times)?;
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
            rank_times: reports.worker_times,
            shares: self.strategy.shares(),
        };
        (progress.logged, progress.steps_since_log) = (progress.times, 0);
        self.emit(event)?;
        for stats in reports.devices {
            self.emit(Event::Device(stats))?;
        }
        Ok(())
    }

    /// After an optimizer step: callbacks, the step limit, pause and stop requests. Workers
    /// that must stop together hold a wish until the next logged step, where every worker's is
    /// gathered; the step limit is the same for all and needs no agreement.
    fn step_stops(&mut self, setup: &TrainingSetup, logged: bool, progress: &mut FitProgress) -> Result<bool> {
        let mut no_metrics = BTreeMap::new();
        let mut action = self.run_callbacks(setup, self.state.epoch, &mut no_metrics, |c, ctx| {
            c.on_train_step_end(ctx)
        })?;
        let at_limit = self.at_step_limit();
        if at_limit {
            progress.report.stop_reason = "max_steps".into();
            action = CallbackAction::Stop;
        }
        while self.pause.load(Ordering::Relaxed) && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.stop.load(Ordering::Relaxed) {
            progress.report.stop_reason = "stopped by request".into();
            action = CallbackAction::Stop;
        }
        if self.strategy.stops_together() && !at_limit {
            progress.stop_wish |= action == CallbackAction::Stop;
            let agreed = logged && self.strategy.any_stops(setup, progress.stop_wish)?;
            if agreed && !progress.stop_wish {
                // A request shared by the workers (Ctrl-C) that arrived while their wishes were
                // gathered is this worker's own, though another saw it first.
                progress.report.stop_reason = match self.stop.load(Ordering::Relaxed) {
                    true => "stopped by request",
                    false => "stopped by another replica",
                }
                .into();
            }
            return Ok(agreed);
        }
        Ok(action == CallbackAction::Stop)
    }

    /// A finished epoch: its loss, validation, the epoch event, the epoch scheduler and the
    /// epoch-end callbacks; true when a callback (early stopping) stops any worker.
    fn end_epoch(
        &mut self,
        setup: &mut TrainingSetup,
        val: Option<&DataLoader>,
        epoch_started: Instant,
        progress: &mut FitProgress,
    ) -> Result<bool> {
        let train_loss = self.state.epoch_loss_sum / self.state.epoch_loss_count.max(1) as f64;
        step::check_finite(train_loss, &self.state, setup)?;
        progress.report.last_train_loss = Some(train_loss);
        let mut metrics = BTreeMap::from([
            ("train_loss".to_string(), train_loss),
            ("lr".to_string(), setup.optimizer.lr()),
        ]);
        let validate = (self.state.epoch + 1).is_multiple_of(self.config.check_val_every_n_epoch);
        let val_metrics = match (validate, val) {
            (true, Some(loader)) => Some(self.evaluate(setup, loader)?),
            _ => None,
        };
        if let Some(m) = &val_metrics {
            metrics.insert("val_loss".into(), m.loss);
            metrics.insert("val_acc".into(), m.accuracy);
        }
        let seconds = epoch_started.elapsed().as_secs_f64();
        self.emit(Event::Epoch {
            epoch: self.state.epoch,
            train_loss,
            val_loss: val_metrics.as_ref().map(|m| m.loss),
            val_accuracy: val_metrics.as_ref().map(|m| m.accuracy),
            lr: setup.optimizer.lr(),
            seconds,
        })?;
        progress.report.epoch_seconds.push(seconds);
        progress.report.last_val = val_metrics;
        // The next epoch starts fresh; callbacks then save a checkpoint that resumes there.
        self.state.epoch += 1;
        self.state.batch_in_epoch = 0;
        self.state.epoch_loss_sum = 0.0;
        self.state.epoch_loss_count = 0;
        if self.config.scheduler_interval == SchedulerInterval::Epoch
            && let Some(s) = setup.scheduler.as_mut()
        {
            s.step(setup.optimizer.as_mut());
        }
        // The state already points at the next epoch (so a checkpoint resumes there); the
        // callbacks are told which epoch ended.
        let ended = self.state.epoch - 1;
        let early =
            self.run_callbacks(setup, ended, &mut metrics, |c, ctx| c.on_epoch_end(ctx))? == CallbackAction::Stop;
        let stops = self.strategy.any_stops(setup, early)?;
        if stops {
            progress.report.stop_reason = match self.stopped_by.as_deref() {
                Some("EarlyStopping") => "early stopping".into(),
                Some(name) => format!("stopped by the {name} callback"),
                None => "stopped by another replica".into(),
            };
        }
        Ok(stops)
    }
}
