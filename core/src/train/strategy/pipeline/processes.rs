//! A pipeline whose stages are processes (as `torch.distributed.pipelining` runs one stage per
//! rank): this process runs one stage, and activations and gradients cross to its neighbours as
//! point-to-point messages. Each boundary has a communicator per direction, because an MPI
//! communicator runs one call at a time and a receive waits inside its call: one communicator
//! for both directions would hold a send behind a receive that waits for it.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};

use crate::backend::Communicator;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::nn::{Module, Sequential};
use crate::tensor::Tensor;
use crate::train::Task;

/// A tensor of micro-batch `usize` between neighbouring stages.
pub(super) type Message = (usize, Tensor);

/// This process's place in a pipeline of one stage per process.
pub struct ProcessStages {
    stage: usize,
    stages: usize,
    /// Every stage's process: the step's loss, stop wishes, reports.
    world: Arc<dyn Communicator>,
    /// The boundary with the previous stage (none on the first).
    before: Option<Boundary>,
    /// The boundary with the next stage (none on the last).
    after: Option<Boundary>,
}

/// The two communicators of one boundary between neighbouring stages.
struct Boundary {
    activations: Box<dyn Communicator>,
    gradients: Box<dyn Communicator>,
}

impl ProcessStages {
    /// This process runs stage `world.rank()` of `world.world_size()` stages. `more` makes a
    /// further communicator over the same ranks (MPI's `duplicate`); every rank calls it
    /// 2 × (stages − 1) times, in the same order, as collectives must be.
    pub fn new(
        world: Arc<dyn Communicator>,
        mut more: impl FnMut() -> Result<Box<dyn Communicator>>,
    ) -> Result<ProcessStages> {
        let (stage, stages) = (world.rank(), world.world_size());
        let mut before = None;
        let mut after = None;
        for boundary in 0..stages.saturating_sub(1) {
            let link = Boundary {
                activations: more()?,
                gradients: more()?,
            };
            for comm in [&link.activations, &link.gradients] {
                if comm.rank() != stage || comm.world_size() != stages {
                    return Err(Error::invalid(
                        "pipeline across processes",
                        format!(
                            "a boundary's communicator is rank {} of {}, but the world's is rank {stage} of {stages}: make them over the same ranks",
                            comm.rank(),
                            comm.world_size()
                        ),
                    ));
                }
            }
            if boundary + 1 == stage {
                before = Some(link);
            } else if boundary == stage {
                after = Some(link);
            }
        }
        Ok(ProcessStages {
            stage,
            stages,
            world,
            before,
            after,
        })
    }

    /// The stage this process runs, from 0.
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// How many stages (processes) the pipeline has.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The communicator over every stage's process.
    pub fn world(&self) -> &Arc<dyn Communicator> {
        &self.world
    }

    pub(super) fn is_last(&self) -> bool {
        self.stage + 1 == self.stages
    }

    /// What the last stage computed (`mine` there, a scalar), on every stage, as f32 on `device`.
    pub(super) fn shared_from_last_stage(&self, mine: Option<Tensor>, device: &Device) -> Result<Tensor> {
        let value = match mine {
            // A fresh buffer, whatever view or dtype the value came in.
            Some(value) => value.to_dtype(DType::F32)?.affine(1.0, 0.0)?,
            None => Tensor::zeros([], DType::F32, device)?,
        };
        self.world.broadcast(value.buffer(), self.stages - 1)?;
        Ok(value)
    }

    /// One evaluation batch (forward only) through every stage's process: this stage's
    /// `module` on the previous stage's output, the last stage's `task` sums on every stage.
    pub(super) fn eval_sums(
        &self,
        module: &Sequential,
        device: &Device,
        task: &dyn Task,
        batch: &[Tensor],
    ) -> Result<(Tensor, Tensor)> {
        let (input, targets) = batch
            .split_first()
            .ok_or_else(|| Error::invalid("evaluate", "a batch needs at least an input tensor"))?;
        let input = match &self.before {
            Some(b) => receive_one(b.activations.as_ref(), self.stage - 1, device)?.1,
            None => input.clone(),
        };
        let sums = match &self.after {
            Some(b) => {
                send_one(b.activations.as_ref(), self.stage + 1, 0, &module.forward(&input)?)?;
                None
            }
            None => {
                let mut batch = vec![input];
                batch.extend(targets.iter().cloned());
                Some(task.eval_sums(module, &batch)?)
            }
        };
        let (loss, correct) = sums.unzip();
        Ok((
            self.shared_from_last_stage(loss, device)?,
            self.shared_from_last_stage(correct, device)?,
        ))
    }

    /// Moves the stage's messages across its boundaries for one step of `micro_batches`
    /// micro-batches: `bridges.activations_in` feeds the stage the previous stage's outputs,
    /// `activations_out` takes the stage's outputs to the next, and the same for gradients
    /// the other way. Each runs on a thread of `scope` until its side of the step is done.
    pub(super) fn bridge<'scope, 'env>(
        &'env self,
        scope: &'scope std::thread::Scope<'scope, 'env>,
        micro_batches: usize,
        device: &'env Device,
        ends: BridgeEnds,
    ) -> Vec<std::thread::ScopedJoinHandle<'scope, Result<()>>> {
        let mut threads = Vec::new();
        let (previous, next) = (self.stage.wrapping_sub(1), self.stage + 1);
        if let (Some(b), Some(tx)) = (&self.before, ends.activations_in) {
            threads.push(scope.spawn(move || receive(b.activations.as_ref(), previous, micro_batches, device, tx)));
        }
        if let (Some(b), Some(rx)) = (&self.before, ends.gradients_out) {
            threads.push(scope.spawn(move || send(b.gradients.as_ref(), previous, rx)));
        }
        if let (Some(b), Some(rx)) = (&self.after, ends.activations_out) {
            threads.push(scope.spawn(move || send(b.activations.as_ref(), next, rx)));
        }
        if let (Some(b), Some(tx)) = (&self.after, ends.gradients_in) {
            threads.push(scope.spawn(move || receive(b.gradients.as_ref(), next, micro_batches, device, tx)));
        }
        threads
    }
}

/// The far ends of the stage's channels, which the bridges serve.
#[derive(Default)]
pub(super) struct BridgeEnds {
    pub activations_in: Option<Sender<Message>>,
    pub activations_out: Option<Receiver<Message>>,
    pub gradients_in: Option<Sender<Message>>,
    pub gradients_out: Option<Receiver<Message>>,
}

/// The header before each tensor: micro-batch, dtype, rank, then the dims.
const MAX_DIMS: usize = 7;
const HEADER: usize = 3 + MAX_DIMS;
const DTYPES: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U32];

/// Sends each message the stage puts in `outbox` to rank `to`, until the stage drops its end.
fn send(comm: &dyn Communicator, to: usize, outbox: Receiver<Message>) -> Result<()> {
    for (micro, tensor) in outbox {
        send_one(comm, to, micro, &tensor)?;
    }
    Ok(())
}

/// Receives `count` messages from rank `from` into the stage's `inbox`, onto `device`.
fn receive(comm: &dyn Communicator, from: usize, count: usize, device: &Device, inbox: Sender<Message>) -> Result<()> {
    for _ in 0..count {
        if inbox.send(receive_one(comm, from, device)?).is_err() {
            // The stage failed; its error is the one reported.
            break;
        }
    }
    Ok(())
}

/// A header (micro-batch, dtype, shape), then the tensor's elements.
fn send_one(comm: &dyn Communicator, to: usize, micro: usize, tensor: &Tensor) -> Result<()> {
    let t = tensor.contiguous()?;
    comm.send(header(micro, &t)?.buffer(), to)?;
    comm.send(t.buffer(), to)
}

/// The next tensor from rank `from`, onto `device`, with its micro-batch.
fn receive_one(comm: &dyn Communicator, from: usize, device: &Device) -> Result<Message> {
    let head = Tensor::zeros([HEADER], DType::U32, device)?;
    comm.recv(head.buffer(), from)?;
    let (micro, dtype, dims) = read_header(&head.to_vec::<u32>()?, from)?;
    let tensor = Tensor::zeros(dims, dtype, device)?;
    comm.recv(tensor.buffer(), from)?;
    Ok((micro, tensor))
}

fn header(micro: usize, t: &Tensor) -> Result<Tensor> {
    let too_big = || {
        Error::invalid(
            "pipeline across processes",
            format!(
                "an activation of shape {:?} cannot cross to another process (at most {MAX_DIMS} dims, each below 2^32)",
                t.dims()
            ),
        )
    };
    if t.dims().len() > MAX_DIMS {
        return Err(too_big());
    }
    let dtype = DTYPES.iter().position(|&d| d == t.dtype()).ok_or_else(too_big)?;
    let mut words = vec![micro, dtype, t.dims().len()];
    words.extend(t.dims());
    words.resize(HEADER, 0);
    let words = words
        .into_iter()
        .map(|w| u32::try_from(w).map_err(|_| too_big()))
        .collect::<Result<Vec<u32>>>()?;
    Tensor::from_host(u32::into_host(words), [HEADER], t.device())
}

fn read_header(words: &[u32], from: usize) -> Result<(usize, DType, Vec<usize>)> {
    let bad = || {
        Error::invalid(
            "pipeline across processes",
            format!(
                "stage {from} sent a header this build cannot read ({words:?}): run the same lockstep on every rank"
            ),
        )
    };
    let dtype = *DTYPES.get(words[1] as usize).ok_or_else(bad)?;
    let rank = words[2] as usize;
    if rank > MAX_DIMS {
        return Err(bad());
    }
    let dims = words[3..3 + rank].iter().map(|&d| d as usize).collect();
    Ok((words[0] as usize, dtype, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written_and_a_foreign_one_is_refused() {
        let cpu = Device::cpu();
        let t = Tensor::zeros([3, 1, 5], DType::BF16, &cpu).unwrap();
        let words = header(6, &t).unwrap().to_vec::<u32>().unwrap();
        assert_eq!(read_header(&words, 0).unwrap(), (6, DType::BF16, vec![3, 1, 5]));
        let mut foreign = words.clone();
        foreign[1] = 99;
        let err = read_header(&foreign, 2).unwrap_err().to_string();
        assert!(err.contains("stage 2 sent a header"), "{err}");
        foreign[1] = 0;
        foreign[2] = 8;
        assert!(read_header(&foreign, 2).is_err());
        let deep = Tensor::zeros([1; 8], DType::F32, &cpu).unwrap();
        assert!(header(0, &deep).unwrap_err().to_string().contains("at most 7 dims"));
    }
}
