//! The gradient reducer (PyTorch DDP's): parameters are packed into buckets in reverse
//! registration order (the order backward finishes them), the first bucket small so
//! communication starts early; a grad-ready hook copies each gradient into its bucket, and a
//! bucket is averaged across replicas the moment its last gradient lands, while backward is
//! still running. `finish` writes the averaged gradients back. With `set_sync(false)`
//! (accumulation steps) nothing is communicated.
//!
//! This version all-reduces on the backward thread; a communication thread (so the wait hides
//! behind the rest of backward) is the next step.

use std::sync::{Arc, Mutex};

use super::verify_same_model;
use crate::backend::{Communicator, ReduceOp};
use crate::error::{Error, Result};
use crate::nn::{Module, ModuleExt};
use crate::shape::Layout;
use crate::tensor::Tensor;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReducerConfig {
    /// Capacity of the first bucket (PyTorch: 1 MiB), so the first all-reduce starts early.
    pub first_bucket_bytes: usize,
    /// Capacity of the other buckets (PyTorch: 25 MiB).
    pub bucket_bytes: usize,
}

impl Default for ReducerConfig {
    fn default() -> Self {
        ReducerConfig {
            first_bucket_bytes: 1 << 20,
            bucket_bytes: 25 << 20,
        }
    }
}

struct Slot {
    param: Tensor,
    offset: usize,
}

struct Bucket {
    /// Flat gradients of its parameters, on their device.
    flat: Tensor,
    slots: Vec<Slot>,
    ready: usize,
}

struct State {
    buckets: Vec<Bucket>,
    /// Parameter id -> (bucket, slot).
    index: std::collections::HashMap<u64, (usize, usize)>,
    sync: bool,
    /// Buckets reduced in this backward pass.
    reduced: usize,
    comm: Arc<dyn Communicator>,
}

pub struct Reducer {
    state: Arc<Mutex<State>>,
}

impl Reducer {
    /// `new` for a model's parameters, after checking every replica holds the same model
    /// (names, shapes, dtypes); a difference is refused on every rank, naming it.
    pub fn for_model(model: &dyn Module, comm: Arc<dyn Communicator>, config: ReducerConfig) -> Result<Reducer> {
        let named = model.named_parameters();
        verify_same_model(&named, comm.as_ref())?;
        let params: Vec<Tensor> = named.into_iter().map(|(_, p)| p).collect();
        Reducer::new(&params, comm, config)
    }

    /// Makes every replica start from rank 0's parameters (as DDP's constructor does), buckets
    /// `params` (all on one device) and hooks their gradients.
    pub fn new(params: &[Tensor], comm: Arc<dyn Communicator>, config: ReducerConfig) -> Result<Reducer> {
        for p in params {
            let dense = p.is_contiguous() && p.layout().offset == 0 && p.buffer().len() == p.elem_count();
            if !dense {
                return Err(Error::invalid(
                    "Reducer",
                    format!(
                        "parameter of shape {} is a view; parameters must own their storage",
                        p.shape()
                    ),
                ));
            }
            comm.broadcast(p.buffer(), 0)?;
        }
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut current: Vec<Tensor> = Vec::new();
        let mut bytes = 0;
        let cap = |n: usize| {
            if n == 0 {
                config.first_bucket_bytes
            } else {
                config.bucket_bytes
            }
        };
        // Reverse registration order: the last layers' gradients are ready first.
        for p in params.iter().rev() {
            let size = p.elem_count() * p.dtype().size_in_bytes();
            if !current.is_empty() && bytes + size > cap(buckets.len()) {
                buckets.push(bucket(std::mem::take(&mut current))?);
                bytes = 0;
            }
            bytes += size;
            current.push(p.clone());
        }
        if !current.is_empty() {
            buckets.push(bucket(current)?);
        }
        let mut index = std::collections::HashMap::new();
        for (b, bucket) in buckets.iter().enumerate() {
            for (s, slot) in bucket.slots.iter().enumerate() {
                index.insert(slot.param.id(), (b, s));
            }
        }
        let state = Arc::new(Mutex::new(State {
            buckets,
            index,
            sync: true,
            reduced: 0,
            comm,
        }));
        for p in params {
            let state = state.clone();
            p.add_grad_ready_hook(Arc::new(move |param: &Tensor| on_ready(&state, param)));
        }
        Ok(Reducer { state })
    }

    /// Accumulation steps (`no_sync`) skip communication; the step that syncs reduces once.
    pub fn set_sync(&self, sync: bool) {
        self.lock().sync = sync;
    }

    /// Number of buckets and the parameters of each, in reduction order (for reports).
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.lock().buckets.iter().map(|b| b.slots.len()).collect()
    }

    /// After backward: checks every bucket was reduced and writes the averaged gradients back
    /// into the parameters' `.grad`.
    pub fn finish(&self) -> Result<()> {
        let mut st = self.lock();
        if !st.sync {
            return Ok(());
        }
        if st.reduced != st.buckets.len() {
            return Err(Error::Autograd(format!(
                "only {} of {} gradient buckets were reduced: did every parameter take part in backward?",
                st.reduced,
                st.buckets.len()
            )));
        }
        for b in &st.buckets {
            for slot in &b.slots {
                let view = Layout {
                    shape: slot.param.shape().clone(),
                    strides: slot.param.shape().contiguous_strides(),
                    offset: slot.offset,
                };
                let grad = Tensor::zeros(slot.param.shape().clone(), b.flat.dtype(), b.flat.device())?;
                grad.backend().copy_strided(
                    b.flat.buffer(),
                    &view,
                    grad.buffer(),
                    &Layout::contiguous(slot.param.shape().clone()),
                )?;
                slot.param.set_grad(Some(grad));
            }
        }
        st.reduced = 0;
        st.buckets.iter_mut().for_each(|b| b.ready = 0);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn bucket(params: Vec<Tensor>) -> Result<Bucket> {
    let first = &params[0];
    let total: usize = params.iter().map(Tensor::elem_count).sum();
    let flat = Tensor::zeros([total], first.dtype(), first.device())?;
    let mut offset = 0;
    let slots = params
        .into_iter()
        .map(|param| {
            let slot = Slot { offset, param };
            offset += slot.param.elem_count();
            slot
        })
        .collect();
    Ok(Bucket { flat, slots, ready: 0 })
}

/// A parameter's gradient is final: copy it into its bucket; reduce the bucket when it is full.
fn on_ready(state: &Mutex<State>, param: &Tensor) -> Result<()> {
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    if !st.sync {
        return Ok(());
    }
    let Some(&(b, s)) = st.index.get(&param.id()) else {
        return Ok(());
    };
    let comm = st.comm.clone();
    let bucket = &mut st.buckets[b];
    let slot = &bucket.slots[s];
    let view = Layout {
        shape: param.shape().clone(),
        strides: param.shape().contiguous_strides(),
        offset: slot.offset,
    };
    // An unused parameter contributes zeros, as DDP does.
    let grad = match param.grad() {
        Some(g) => g,
        None => param.detach().zeros_like()?,
    };
    grad.backend()
        .copy_strided(grad.buffer(), grad.layout(), bucket.flat.buffer(), &view)?;
    bucket.ready += 1;
    if bucket.ready == bucket.slots.len() {
        comm.all_reduce(bucket.flat.buffer(), ReduceOp::Mean)?;
        st.reduced += 1;
    }
    Ok(())
}
