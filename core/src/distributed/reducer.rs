//! The gradient reducer (PyTorch DDP's): parameters are packed into buckets in reverse
//! registration order (the order backward is expected to finish them), the first bucket small
//! so communication starts early; a grad-ready hook copies each gradient into its bucket, and
//! full buckets are handed, strictly in bucket order (so every rank issues the same collectives
//! in the same order), to a communication thread that averages them across replicas while
//! backward goes on. After the first synchronised step the buckets are rebuilt once in the
//! order gradients actually arrived on rank 0. `finish` waits for the buckets and writes the
//! averaged gradients back. With `set_sync(false)` (accumulation steps) nothing is communicated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::buckets::{Bucket, assign, assign_by_owner};
use super::comm_worker::{Collective, CommWorker};
use super::verify_same_model;
use crate::backend::{Communicator, ReduceOp};
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::nn::{Module, ModuleExt};
use crate::tensor::Tensor;

/// Gradient bucket sizes for [`Reducer`], as DDP's `bucket_cap_mb`; the default is PyTorch's 1 MiB
/// first bucket and 25 MiB after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReducerConfig {
    /// Capacity of the first bucket (PyTorch: 1 MiB), so the first all-reduce starts early.
    pub first_bucket_bytes: usize,
    /// Capacity of the other buckets (PyTorch: 25 MiB).
    pub bucket_bytes: usize,
}

impl ReducerConfig {
    /// Capacities given in MiB (as PyTorch's `bucket_cap_mb`).
    pub fn from_mib(first_bucket: f64, bucket: f64) -> ReducerConfig {
        let bytes = |mib: f64| (mib * f64::from(1 << 20)) as usize;
        ReducerConfig {
            first_bucket_bytes: bytes(first_bucket),
            bucket_bytes: bytes(bucket),
        }
    }
}

impl Default for ReducerConfig {
    fn default() -> Self {
        ReducerConfig {
            first_bucket_bytes: 1 << 20,
            bucket_bytes: 25 << 20,
        }
    }
}

/// Communication of the last synchronised step, for reports and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommTimes {
    /// Number of buckets all-reduced (one collective each).
    pub buckets: usize,
    /// Seconds the buckets' all-reduces ran (one after another on the communication thread).
    pub all_reduce: f64,
    /// Seconds `finish` waited for them once backward was over: the part not hidden.
    pub exposed: f64,
}

impl CommTimes {
    /// Seconds of all-reduce that ran while backward was still computing.
    pub fn hidden(&self) -> f64 {
        (self.all_reduce - self.exposed).max(0.0)
    }
}

struct State {
    params: Vec<Tensor>,
    buckets: Vec<Bucket>,
    /// Parameter id -> (bucket, slot).
    index: HashMap<u64, (usize, usize)>,
    sync: bool,
    /// The next bucket to launch; buckets launch in index order only.
    next_bucket: usize,
    /// Parameter indices in the order their gradients became ready, until the rebuild.
    arrivals: Option<Vec<usize>>,
    config: ReducerConfig,
    worker: CommWorker,
    comm: Arc<dyn Communicator>,
    last: CommTimes,
    /// ZeRO stage 2: the rank that steps each parameter (by registration index), the only one
    /// its averaged gradient is reduced to and kept on; the others drop it once it is in its
    /// bucket.
    owners: Option<Vec<usize>>,
}

/// Averages gradients across data-parallel replicas as backward produces them, bucket by bucket,
/// as PyTorch's `DistributedDataParallel`; call `finish` after each backward.
pub struct Reducer {
    state: Arc<Mutex<State>>,
    /// Running statistics and other buffers, kept equal to rank 0's after every step.
    buffers: Vec<Tensor>,
}

impl Reducer {
    /// `new` for a model's parameters, after checking every replica holds the same model
    /// (names, shapes, dtypes); a difference is refused on every rank, naming it. The model's
    /// buffers (running statistics) start as rank 0's and are re-broadcast after every step,
    /// as DDP's `broadcast_buffers`.
    pub fn for_model(model: &dyn Module, comm: Arc<dyn Communicator>, config: ReducerConfig) -> Result<Reducer> {
        let named = model.named_parameters();
        verify_same_model(&named, comm.as_ref())?;
        let params: Vec<Tensor> = named.into_iter().map(|(_, p)| p).collect();
        let mut reducer = Reducer::new(&params, comm, config)?;
        reducer.buffers = model.named_buffers().into_iter().map(|(_, b)| b).collect();
        reducer.broadcast_buffers()?;
        Ok(reducer)
    }

    /// Makes every replica start from rank 0's parameters (as DDP's constructor does), buckets
    /// `params` (all on one device) and hooks their gradients.
    pub fn new(params: &[Tensor], comm: Arc<dyn Communicator>, config: ReducerConfig) -> Result<Reducer> {
        for p in params {
            require_dense(p)?;
            comm.broadcast(p.buffer(), 0)?;
        }
        let reverse: Vec<usize> = (0..params.len()).rev().collect();
        let (buckets, index) = build_buckets(params, &reverse, config, None)?;
        let state = Arc::new(Mutex::new(State {
            params: params.to_vec(),
            buckets,
            index,
            sync: true,
            next_bucket: 0,
            arrivals: Some(Vec::with_capacity(params.len())),
            config,
            worker: CommWorker::spawn(comm.clone())?,
            comm,
            last: CommTimes::default(),
            owners: None,
        }));
        for p in params {
            // Weak: the parameters outlive the reducer; its hooks then do nothing.
            let state = Arc::downgrade(&state);
            p.add_grad_ready_hook(Arc::new(move |param: &Tensor| on_ready(&state, param)));
        }
        Ok(Reducer {
            state,
            buffers: Vec::new(),
        })
    }

    /// Accumulation steps (`no_sync`) skip communication; the step that syncs reduces once.
    pub fn set_sync(&self, sync: bool) {
        self.lock().sync = sync;
    }

    /// ZeRO stage 2: `owners[i]` is the rank that steps parameter `i` (by registration index).
    /// The buckets are rebuilt to hold one owner's parameters each and are reduced to that rank
    /// alone; after each synchronised backward a rank holds the averaged gradients of its own
    /// parameters only, and no lasting copy of the others' (their buckets are let go once
    /// reduced).
    pub fn shard_gradients(&self, owners: Vec<usize>) -> Result<()> {
        let mut st = self.lock();
        if owners.len() != st.params.len() {
            return Err(Error::invalid(
                "Reducer",
                format!("{} owners given for {} parameters", owners.len(), st.params.len()),
            ));
        }
        st.owners = Some(owners);
        let reverse: Vec<usize> = (0..st.params.len()).rev().collect();
        let (buckets, index) = build_buckets(&st.params, &reverse, st.config, st.owners.as_deref())?;
        st.buckets = buckets;
        st.index = index;
        Ok(())
    }

    /// Whether `shard_gradients` applies: the same answer on every rank.
    pub fn shards_gradients(&self) -> bool {
        self.lock().owners.is_some()
    }

    /// The parameters (registration indices) of each bucket, in reduction order.
    pub fn buckets(&self) -> Vec<Vec<usize>> {
        let st = self.lock();
        st.buckets
            .iter()
            .map(|b| b.slots.iter().map(|s| s.param).collect())
            .collect()
    }

    /// The communicator gradients are averaged over.
    pub fn communicator(&self) -> Arc<dyn Communicator> {
        self.lock().comm.clone()
    }

    /// Communication of the last synchronised step.
    pub fn last_comm_times(&self) -> CommTimes {
        self.lock().last
    }

    /// After backward: waits for every bucket's all-reduce, writes the averaged gradients back
    /// into the parameters' `.grad`, brings the buffers to rank 0's values and, after the first
    /// step, rebuilds the buckets in the observed order.
    pub fn finish(&self) -> Result<()> {
        let mut st = self.lock();
        if !st.sync {
            return Ok(());
        }
        let drained = st.worker.wait_all()?;
        let launched = st.next_bucket;
        let total = st.buckets.len();
        st.next_bucket = 0;
        st.buckets.iter_mut().for_each(|b| b.ready = 0);
        if launched != total {
            st.arrivals = None;
            return Err(Error::Autograd(format!(
                "only {launched} of {total} gradient buckets were reduced: did every parameter take part in backward?"
            )));
        }
        st.last = CommTimes {
            buckets: total,
            all_reduce: drained.busy.as_secs_f64(),
            exposed: drained.waited.as_secs_f64(),
        };
        let rank = st.comm.rank();
        let State { buckets, params, .. } = &mut *st;
        for b in buckets.iter_mut() {
            if b.owner.is_some_and(|owner| owner != rank) {
                continue;
            }
            let Some(flat) = &b.flat else {
                return Err(Error::Autograd("a reduced gradient bucket holds no buffer".into()));
            };
            for (s, slot) in b.slots.iter().enumerate() {
                let param = &params[slot.param];
                // A copy, not a view: in-place writers (clipping, unscaling) must not reach the bucket.
                param.set_grad(Some(flat.view(b.view_of(s, param)).deep_copy()?));
            }
            if b.owner.is_some() {
                b.flat = None;
            }
        }
        if let Some(arrivals) = st.arrivals.take() {
            rebuild_in_arrival_order(&mut st, arrivals)?;
        }
        drop(st);
        self.broadcast_buffers()
    }

    fn broadcast_buffers(&self) -> Result<()> {
        let comm = self.communicator();
        for b in &self.buffers {
            require_dense(b)?;
            comm.broadcast(b.buffer(), 0)?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A parameter or buffer is communicated through its whole storage.
fn require_dense(p: &Tensor) -> Result<()> {
    let dense = p.is_contiguous() && p.layout().offset == 0 && p.buffer().len() == p.elem_count();
    if dense {
        return Ok(());
    }
    Err(Error::invalid(
        "Reducer",
        format!(
            "tensor of shape {} is a view; parameters and buffers must own their storage",
            p.shape()
        ),
    ))
}

type Buckets = (Vec<Bucket>, HashMap<u64, (usize, usize)>);

/// Buckets over `params` taken in `order`, each of one owner's parameters where `owners` are
/// given, and where each parameter landed.
fn build_buckets(
    params: &[Tensor],
    order: &[usize],
    config: ReducerConfig,
    owners: Option<&[usize]>,
) -> Result<Buckets> {
    let bytes = |i: usize| params[i].elem_count() * params[i].dtype().size_in_bytes();
    let (first, cap) = (config.first_bucket_bytes, config.bucket_bytes);
    let groups = match owners {
        Some(owners) => assign_by_owner(order, bytes, |i| owners[i], first, cap),
        None => assign(order, bytes, first, cap),
    };
    let buckets = groups
        .iter()
        .map(|members| Bucket::new(members, params, owners.map(|o| o[members[0]])))
        .collect::<Result<Vec<_>>>()?;
    let mut index = HashMap::new();
    for (b, bucket) in buckets.iter().enumerate() {
        for (s, slot) in bucket.slots.iter().enumerate() {
            index.insert(params[slot.param].id(), (b, s));
        }
    }
    Ok((buckets, index))
}

/// Rebuilds the buckets once, in the order gradients arrived on rank 0 (broadcast so every
/// rank holds the same buckets, as DDP's `sync_bucket_indices`).
fn rebuild_in_arrival_order(st: &mut State, arrivals: Vec<usize>) -> Result<()> {
    let n = st.params.len();
    if arrivals.len() != n {
        return Ok(());
    }
    let device = st.params[0].device().clone();
    let order = HostVec::U32(arrivals.iter().map(|&i| i as u32).collect());
    let order = Tensor::from_host(order, [n], &device)?;
    st.comm.broadcast(order.buffer(), 0)?;
    let order: Vec<usize> = order.to_vec::<u32>()?.into_iter().map(|i| i as usize).collect();
    let mut seen = vec![false; n];
    if order.iter().any(|&i| i >= n || std::mem::replace(&mut seen[i], true)) {
        return Err(Error::invalid(
            "Reducer",
            "rank 0's gradient order is not a permutation of this rank's parameters: do all ranks build the same model?",
        ));
    }
    let (buckets, index) = build_buckets(&st.params, &order, st.config, st.owners.as_deref())?;
    st.buckets = buckets;
    st.index = index;
    Ok(())
}

/// A parameter's gradient is final: copy it into its bucket and launch every bucket that is
/// now full, in bucket order.
fn on_ready(state: &Weak<Mutex<State>>, param: &Tensor) -> Result<()> {
    let Some(state) = state.upgrade() else {
        return Ok(());
    };
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    if !st.sync {
        return Ok(());
    }
    let Some(&(b, s)) = st.index.get(&param.id()) else {
        return Ok(());
    };
    let registered = st.buckets[b].slots[s].param;
    if let Some(arrivals) = st.arrivals.as_mut() {
        arrivals.push(registered);
    }
    let bucket = &mut st.buckets[b];
    // An unused parameter contributes zeros, as DDP does.
    let grad = match param.grad() {
        Some(g) => g,
        None => param.detach().zeros_like()?,
    };
    let target = bucket.view_of(s, param);
    let flat = bucket.storage(param)?;
    grad.backend()
        .copy_strided(grad.buffer(), grad.layout(), flat.buffer(), &target)?;
    bucket.ready += 1;
    if st.owners.is_some() {
        // `finish` writes the averaged gradient back where it is kept.
        param.set_grad(None);
    }
    let st = &mut *st;
    let rank = st.comm.rank();
    while st.next_bucket < st.buckets.len() && st.buckets[st.next_bucket].is_full() {
        let bucket = &mut st.buckets[st.next_bucket];
        let collective = match bucket.owner {
            None => Collective::AllReduce,
            Some(root) => Collective::Reduce { root },
        };
        // Another rank's bucket goes to the communication thread alone, and is let go there
        // once reduced.
        let flat = match bucket.owner {
            Some(owner) if owner != rank => bucket.flat.take(),
            _ => bucket.flat.clone(),
        };
        let flat = flat.ok_or_else(|| Error::Autograd("a full gradient bucket holds no buffer".into()))?;
        st.worker.launch(flat.buffer().clone(), collective, ReduceOp::Mean)?;
        st.next_bucket += 1;
    }
    Ok(())
}
