//! The replica consistency check (`TrainerConfig::replica_check`): replicas on cpu:0 and cpu:1
//! where rank 1's copy of one weight is moved by 1e-4 after step 2, as a device that rounds
//! differently would over many steps. Unchecked, the replicas end apart; checked, the run stops naming the
//! weight, or takes rank 0's parameters and ends identical.

mod parallel_support;
mod replica_support;

use std::sync::Arc;
use std::time::Duration;

use lockstep_core::backend::Communicator;
use lockstep_core::data::{DataLoader, DataLoaderConfig, DistributedSampler};
use lockstep_core::distributed::{OnDrift, Reducer, ReducerConfig, ReplicaCheck};
use lockstep_core::nn::ModuleExt;
use lockstep_core::train::{Callback, CallbackAction, CallbackContext, DataParallel, Progress, Trainer, TrainerConfig};
use lockstep_core::{Result, Tensor};
use parallel_support::on_cpu_ranks_with_timeout;
use replica_support::{LEN, Points, SEED, config, setup, weights};

/// Moves the first element of `param` by 1e-4 after optimizer step `step` (one ulp can be
/// rounded away by the next update, which rank 0 applies alike).
struct NudgeAfter {
    step: u64,
    param: Tensor,
}

impl Callback for NudgeAfter {
    fn name(&self) -> String {
        "nudge".into()
    }
    fn on_train_step_end(&mut self, ctx: &mut CallbackContext) -> Result<CallbackAction> {
        if ctx.global_step == self.step {
            let mut values = self.param.to_vec::<f32>()?;
            values[0] += 1e-4;
            self.param.assign(&Tensor::from_vec(
                values,
                self.param.shape().clone(),
                self.param.device(),
            )?)?;
        }
        Ok(CallbackAction::Continue)
    }
}

/// Two replicas, rank 1 nudged after step 2 in `3.weight` (the last layer's weight), each
/// checking as `check` says: each rank's final weights or its error.
fn nudged_replicas(check: Option<ReplicaCheck>) -> Vec<Outcome> {
    replicas(Some(2), check)
}

/// Each rank's final weights, or its error.
type Outcome = std::result::Result<Vec<Vec<f32>>, String>;

/// Two replicas, rank 1 nudged after step `nudge` if any, checking as `check` says.
fn replicas(nudge: Option<u64>, check: Option<ReplicaCheck>) -> Vec<Outcome> {
    on_cpu_ranks_with_timeout(2, Duration::from_secs(30), move |device, comm| {
        let rank = comm.rank();
        let mut s = setup(&device);
        let reducer = Reducer::new(&s.model.parameters(), Arc::new(comm), ReducerConfig::default()).unwrap();
        let sampler = Arc::new(DistributedSampler::new(LEN, 2, rank, true, SEED, false).unwrap());
        let loader_config = DataLoaderConfig {
            batch_size: 8,
            ..Default::default()
        };
        let loader = DataLoader::new(Arc::new(Points), sampler, loader_config).unwrap();
        let config = TrainerConfig {
            replica_check: check,
            progress: Progress::Off,
            ..config(1)
        };
        let mut trainer = Trainer::new(config).unwrap().with_strategy(DataParallel::new(reducer));
        if let Some(step) = nudge.filter(|_| rank == 1) {
            let param = s.model.named_parameters()[2].clone();
            assert_eq!(param.0, "3.weight");
            trainer.add_callback(NudgeAfter { step, param: param.1 });
        }
        let fitted = trainer.fit(&mut s, &loader, None);
        drop(trainer);
        fitted.map(|_| weights(&s)).map_err(|e| e.to_string())
    })
}

fn every(n: u64, on_drift: OnDrift) -> Option<ReplicaCheck> {
    Some(ReplicaCheck {
        every_n_steps: n,
        on_drift,
    })
}

#[test]
fn unchecked_replicas_that_round_differently_end_apart() {
    let r = nudged_replicas(None);
    let (a, b) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
    assert_ne!(a, b, "a nudge after step 2 must still show after 3 epochs");
}

#[test]
fn a_drift_stops_every_replica_naming_the_parameter_and_the_rank() {
    for (n, step) in [(1, 3), (4, 4)] {
        let r = nudged_replicas(every(n, OnDrift::Stop));
        for (rank, outcome) in r.iter().enumerate() {
            let e = outcome.as_ref().expect_err("the check stops every rank");
            assert!(e.contains(&format!("at step {step}")), "rank {rank}, every {n}: {e}");
            assert!(e.contains("`3.weight` on rank 1"), "rank {rank}: {e}");
            assert!(e.contains("rebroadcast"), "says what to do: {e}");
        }
    }
}

#[test]
fn a_drift_under_rebroadcast_leaves_every_replica_with_rank_0s_parameters() {
    let r = nudged_replicas(every(2, OnDrift::Rebroadcast));
    let (a, b) = (r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
    assert_eq!(a, b, "re-broadcast at step 2 makes the replicas identical again");
}

#[test]
fn replicas_that_agree_pass_every_check() {
    let r = replicas(None, every(1, OnDrift::Stop));
    assert_eq!(r[0].as_ref().unwrap(), r[1].as_ref().unwrap());
}

#[test]
fn a_check_every_zero_steps_is_refused() {
    let config = TrainerConfig {
        replica_check: every(0, OnDrift::Stop),
        ..Default::default()
    };
    let e = Trainer::new(config).err().expect("refused").to_string();
    assert!(e.contains("every_n_steps"), "{e}");
}

#[test]
fn a_check_without_replicas_is_refused_before_the_first_step() {
    let device = lockstep_core::Device::cpu();
    let mut s = setup(&device);
    let loader = DataLoader::new(
        Arc::new(Points),
        Arc::new(lockstep_core::data::SequentialSampler { len: LEN }),
        DataLoaderConfig::default(),
    )
    .unwrap();
    let config = TrainerConfig {
        replica_check: every(1, OnDrift::Stop),
        ..config(1)
    };
    let e = Trainer::new(config)
        .unwrap()
        .fit(&mut s, &loader, None)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("no replicas to compare"), "{e}");
}
