//! Runs one step of a schedule: a thread per stage, each running its actions in order,
//! activations sent forward and their gradients back over channels. A stage's input arrives
//! detached and becomes a leaf of the stage's own graph; its gradient is what goes back. In a
//! pipeline of processes, this process runs one stage and bridges carry its channels' far ends
//! to its neighbours (`processes`).

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use super::processes::{BridgeEnds, Message, ProcessStages};
use super::schedule::{Action, Pass, Schedule};
use crate::autocast::AutocastGuard;
use crate::distributed::Reducer;
use crate::error::{Error, Result};
use crate::nn::{Module, Sequential, StagedModel};
use crate::tensor::Tensor;
use crate::train::Task;
use crate::train::events::StepTimes;
use crate::train::step::MicroBatch;

/// Runs `schedule` over `batch` (its first tensor the input on the first stage's device, the
/// rest targets on the last stage's) cut into the schedule's micro-batches; each micro-batch's
/// loss is weighted by `batch.weight / M`. With `reducers` (one per stage) each stage's
/// gradients start their all-reduce during its last backward. With `processes`, `model` holds
/// this process's stage alone. Returns the mean of the micro-batches' losses, detached, on the
/// last stage's device: `None` in a process that does not run the last stage.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_step(
    model: &StagedModel,
    processes: Option<&ProcessStages>,
    task: &dyn Task,
    schedule: &Schedule,
    pools: &[Option<rayon::ThreadPool>],
    reducers: &[Reducer],
    batch: &MicroBatch<'_>,
    times: &mut StepTimes,
) -> Result<(Option<Tensor>, StepProfile)> {
    let (stages, micro_batches) = (schedule.stages, schedule.micro_batches);
    let (input, targets) = batch
        .tensors
        .split_first()
        .ok_or_else(|| Error::invalid("pipeline", "a batch needs at least an input tensor"))?;
    let inputs = chunks(input, micro_batches)?;
    let targets: Vec<Vec<Tensor>> = targets
        .iter()
        .map(|t| chunks(t, micro_batches))
        .collect::<Result<_>>()?;
    let weight = batch.weight / micro_batches as f64;

    let first_stage = processes.map_or(0, ProcessStages::stage);
    let (ends, far) = match processes {
        None => (local_ends(stages), None),
        Some(p) => {
            let (ends, far) = process_ends(p);
            (vec![ends], Some(far))
        }
    };
    let started = Instant::now();
    let (outcomes, bridge_errors) = std::thread::scope(|scope| {
        let bridges = match (processes, far) {
            (Some(p), Some(far)) => p.bridge(scope, micro_batches, &model.devices()[0], far),
            _ => Vec::new(),
        };
        let mut handles = Vec::with_capacity(ends.len());
        for (i, ends) in ends.into_iter().enumerate() {
            let s = first_stage + i;
            let actions = &schedule.actions[s];
            let last = s + 1 == stages;
            let run = StageRun {
                stage: s,
                module: &model.stages()[i],
                reducer: reducers.get(i),
                last_backward: actions.iter().rev().find(|a| a.pass == Pass::Backward).map(|a| a.micro),
                device: &model.devices()[i],
                task,
                batch,
                weight,
                inputs: if s == 0 { inputs.clone() } else { Vec::new() },
                targets: if last { targets.clone() } else { Vec::new() },
                ends,
            };
            let pool = pools.get(i).and_then(Option::as_ref);
            handles.push(scope.spawn(move || match pool {
                // Each CPU stage computes on its own threads, not in one pool with the others.
                Some(pool) => pool.install(|| run.actions(actions)),
                None => run.actions(actions),
            }));
        }
        let outcomes: Vec<std::result::Result<StageOutcome, StageFailure>> = handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(StageFailure {
                        error: Error::invalid("pipeline", format!("stage {} panicked", first_stage + i)),
                        secondary: false,
                    })
                })
            })
            .collect();
        let bridge_errors: Vec<Error> = bridges
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(result) => result.err(),
                Err(_) => Some(Error::invalid(
                    "pipeline",
                    "a bridge to another stage's process panicked",
                )),
            })
            .collect();
        (outcomes, bridge_errors)
    });
    let wall = started.elapsed().as_secs_f64();
    // A stage that failed first is the cause; its neighbours then fail for want of messages,
    // which a failed bridge to another process explains better.
    let mut results = Vec::with_capacity(stages);
    let mut secondary = bridge_errors.into_iter().next();
    for outcome in outcomes {
        match outcome {
            Ok(o) => results.push(o),
            Err(StageFailure {
                error,
                secondary: false,
            }) => return Err(error),
            Err(StageFailure { error, .. }) => secondary = secondary.or(Some(error)),
        }
    }
    if let Some(error) = secondary {
        return Err(error);
    }
    let profile = StepProfile {
        wall,
        stages: results.iter().map(|o| o.compute).collect(),
    };
    let (forward, backward) = profile
        .stages
        .iter()
        .fold((0.0, 0.0), |(f, b), c| (f + c.forward, b + c.backward));
    // Stages overlap: the step's wall time is shared out by the stages' compute in each pass.
    let share = if forward + backward > 0.0 {
        forward / (forward + backward)
    } else {
        0.5
    };
    times.forward += wall * share;
    times.backward += wall * (1.0 - share);
    if processes.is_some_and(|p| !p.is_last()) {
        return Ok((None, profile));
    }
    let losses = results.pop().map(|o| o.losses).unwrap_or_default();
    let mut sum = losses
        .first()
        .cloned()
        .ok_or_else(|| Error::invalid("pipeline", "the last stage computed no loss"))?;
    for l in &losses[1..] {
        sum = sum.add(l)?;
    }
    Ok((Some(sum.affine(1.0 / micro_batches as f64, 0.0)?), profile))
}

/// One stage's ends of the channels to its neighbours (none where it has no neighbour).
#[derive(Default)]
struct StageEnds {
    from_previous: Option<Inbox>,
    to_next: Option<Sender<Message>>,
    grad_from_next: Option<Inbox>,
    grad_to_previous: Option<Sender<Message>>,
}

/// Every stage runs here: one channel each way between neighbours.
fn local_ends(stages: usize) -> Vec<StageEnds> {
    let mut ends: Vec<StageEnds> = (0..stages).map(|_| StageEnds::default()).collect();
    for b in 1..stages {
        let (tx, rx) = channel();
        ends[b - 1].to_next = Some(tx);
        ends[b].from_previous = Some(Inbox::new(rx));
        let (tx, rx) = channel();
        ends[b].grad_to_previous = Some(tx);
        ends[b - 1].grad_from_next = Some(Inbox::new(rx));
    }
    ends
}

/// This process's one stage: the far end of each of its channels goes to a bridge to the
/// neighbour's process.
fn process_ends(p: &ProcessStages) -> (StageEnds, BridgeEnds) {
    let (mut ends, mut far) = (StageEnds::default(), BridgeEnds::default());
    if p.stage() > 0 {
        let (tx, rx) = channel();
        (ends.from_previous, far.activations_in) = (Some(Inbox::new(rx)), Some(tx));
        let (tx, rx) = channel();
        (ends.grad_to_previous, far.gradients_out) = (Some(tx), Some(rx));
    }
    if !p.is_last() {
        let (tx, rx) = channel();
        (ends.to_next, far.activations_out) = (Some(tx), Some(rx));
        let (tx, rx) = channel();
        (ends.grad_from_next, far.gradients_in) = (Some(Inbox::new(rx)), Some(tx));
    }
    (ends, far)
}

/// Where one step's time went, per stage (host time).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepProfile {
    /// The whole step, first forward to last backward.
    pub wall: f64,
    /// Each stage's compute time, by stage.
    pub stages: Vec<StageCompute>,
}

/// One stage's time computing in a step; the rest of the step it waited (the bubble).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageCompute {
    /// Seconds in the stage's forward passes (the last stage's loss included), each timed from its
    /// input's arrival.
    pub forward: f64,
    /// Seconds in the stage's backward passes, each timed from its gradient's arrival.
    pub backward: f64,
}

impl StepProfile {
    /// The share of stage-time spent waiting: 1 − Σ compute / (stages × wall).
    pub fn bubble_fraction(&self) -> f64 {
        let busy: f64 = self.stages.iter().map(|c| c.forward + c.backward).sum();
        let capacity = self.stages.len() as f64 * self.wall;
        if capacity > 0.0 {
            (1.0 - busy / capacity).max(0.0)
        } else {
            0.0
        }
    }
}

/// `micro_batches` consecutive slices along the first axis; the first `n % M` one sample
/// larger (as `torch.tensor_split`).
fn chunks(t: &Tensor, micro_batches: usize) -> Result<Vec<Tensor>> {
    let n = t.dims().first().copied().unwrap_or(0);
    if n < micro_batches {
        return Err(Error::invalid(
            "pipeline",
            format!(
                "a batch of {n} samples cannot make {micro_batches} micro-batches; use at most {n} micro-batches or a larger batch"
            ),
        ));
    }
    let (base, extra) = (n / micro_batches, n % micro_batches);
    let mut start = 0;
    (0..micro_batches)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let part = t.narrow(0, start, len);
            start += len;
            part
        })
        .collect()
}

/// Messages from one neighbour, by micro-batch; ones that come early wait here.
struct Inbox {
    rx: Receiver<Message>,
    early: HashMap<usize, Tensor>,
}

impl Inbox {
    fn new(rx: Receiver<Message>) -> Inbox {
        Inbox {
            rx,
            early: HashMap::new(),
        }
    }

    fn take(&mut self, micro: usize) -> Option<Tensor> {
        if let Some(t) = self.early.remove(&micro) {
            return Some(t);
        }
        loop {
            let (m, t) = self.rx.recv().ok()?;
            if m == micro {
                return Some(t);
            }
            self.early.insert(m, t);
        }
    }
}

struct StageOutcome {
    /// The last stage's unweighted micro-batch losses, in order.
    losses: Vec<Tensor>,
    compute: StageCompute,
}

struct StageFailure {
    error: Error,
    /// Failed because a neighbour stopped sending (the neighbour's error is the cause).
    secondary: bool,
}

impl From<Error> for StageFailure {
    fn from(error: Error) -> StageFailure {
        StageFailure {
            error,
            secondary: false,
        }
    }
}

/// What one stage's thread holds.
struct StageRun<'a> {
    stage: usize,
    module: &'a Sequential,
    /// Averages this stage's gradients with the other replicas' (hybrid data × pipeline),
    /// during the stage's last backward of a step that syncs.
    reducer: Option<&'a Reducer>,
    last_backward: Option<usize>,
    device: &'a crate::device::Device,
    task: &'a dyn Task,
    batch: &'a MicroBatch<'a>,
    weight: f64,
    inputs: Vec<Tensor>,
    targets: Vec<Vec<Tensor>>,
    ends: StageEnds,
}

/// A forwarded micro-batch waiting for its backward: the stage's input leaf and its output
/// (the weighted loss on the last stage).
struct Held {
    input: Tensor,
    output: Tensor,
}

impl StageRun<'_> {
    fn actions(mut self, actions: &[Action]) -> std::result::Result<StageOutcome, StageFailure> {
        let mut held: HashMap<usize, Held> = HashMap::new();
        let mut outcome = StageOutcome {
            losses: Vec::new(),
            compute: StageCompute::default(),
        };
        // Compute time is counted from when a pass's input has arrived: waiting for a
        // neighbour is the bubble.
        for action in actions {
            match action.pass {
                Pass::Forward => {
                    let h = self.forward(action.micro, &mut outcome.losses, &mut outcome.compute.forward)?;
                    held.insert(action.micro, h);
                }
                Pass::Backward => {
                    let h = held
                        .remove(&action.micro)
                        .ok_or_else(|| Error::invalid("pipeline", format!("{action} runs before its forward")))?;
                    self.backward(action.micro, h, &mut outcome.compute.backward)?;
                }
            }
        }
        Ok(outcome)
    }

    fn forward(
        &mut self,
        micro: usize,
        losses: &mut Vec<Tensor>,
        compute: &mut f64,
    ) -> std::result::Result<Held, StageFailure> {
        let received = match &mut self.ends.from_previous {
            None => None,
            Some(inbox) => Some(inbox.take(micro).ok_or_else(|| self.starved(micro, "activations"))?),
        };
        let _timer = Timer::new(compute);
        let input = match received {
            None => self.inputs[micro].clone(),
            Some(x) => x.to_device(self.device)?.requires_grad(true),
        };
        let _autocast = self
            .batch
            .precision
            .autocast_dtype()
            .map(AutocastGuard::new)
            .transpose()?;
        let Some(to_next) = &self.ends.to_next else {
            let mut batch = vec![input.clone()];
            batch.extend(self.targets.iter().map(|t| t[micro].clone()));
            let loss = self.task.loss(self.module, &batch)?;
            losses.push(loss.detach());
            let mut output = loss.affine(self.weight, 0.0)?;
            if let Some(scaler) = self.batch.scaler {
                output = scaler.scale_loss(&output)?;
            }
            return Ok(Held { input, output });
        };
        let output = self.module.forward(&input)?;
        // A closed channel means the next stage failed; its error is the one reported.
        let _ = to_next.send((micro, output.detach()));
        Ok(Held { input, output })
    }

    fn backward(&mut self, micro: usize, held: Held, compute: &mut f64) -> std::result::Result<(), StageFailure> {
        let received = match &mut self.ends.grad_from_next {
            None => None,
            Some(inbox) => Some(inbox.take(micro).ok_or_else(|| self.starved(micro, "gradients"))?),
        };
        let _timer = Timer::new(compute);
        if let Some(reducer) = self.reducer {
            reducer.set_sync(self.batch.ends_step && self.last_backward == Some(micro));
        }
        match received {
            None => held.output.backward()?,
            Some(g) => held.output.backward_with(g.to_device(self.device)?)?,
        }
        if let Some(to_previous) = &self.ends.grad_to_previous {
            let g = held.input.grad().ok_or_else(|| {
                Error::invalid(
                    "pipeline",
                    format!("stage {}'s output does not depend on its input", self.stage),
                )
            })?;
            let _ = to_previous.send((micro, g.detach()));
        }
        Ok(())
    }

    fn starved(&self, micro: usize, what: &str) -> StageFailure {
        StageFailure {
            error: Error::invalid(
                "pipeline",
                format!(
                    "stage {}: the {what} of micro-batch {micro} never came (a neighbouring stage failed)",
                    self.stage
                ),
            ),
            secondary: true,
        }
    }
}

/// Adds the time until it is dropped to a running total.
struct Timer<'a> {
    total: &'a mut f64,
    started: Instant,
}

impl<'a> Timer<'a> {
    fn new(total: &'a mut f64) -> Timer<'a> {
        Timer {
            total,
            started: Instant::now(),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        *self.total += self.started.elapsed().as_secs_f64();
    }
}
