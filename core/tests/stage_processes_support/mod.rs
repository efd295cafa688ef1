//! Pipeline stages as "processes" in one test: a thread per stage, each with in-process
//! communicators standing in for MPI's (CI's MPI step runs the same through `lockstep launch`).
#![allow(dead_code)]

use std::sync::Arc;

use lockstep_core::backend::{Communicator, LocalCommunicator};
use lockstep_core::train::pipeline::ProcessStages;
use lockstep_core::{Device, Result};

pub fn cpu(i: usize) -> Device {
    Device::parse(&format!("cpu:{i}")).unwrap()
}

/// `LocalCommunicator` groups over one device per stage: the world, then two per boundary.
fn stage_comms(stages: usize) -> Vec<Vec<LocalCommunicator>> {
    let mut per_stage: Vec<Vec<LocalCommunicator>> = (0..stages).map(|_| Vec::new()).collect();
    for _ in 0..1 + 2 * (stages - 1) {
        let group = LocalCommunicator::group((0..stages).map(|s| cpu(s).backend().clone()).collect());
        for (stage, comm) in group.into_iter().enumerate() {
            per_stage[stage].push(comm);
        }
    }
    per_stage
}

/// `run(stage, its place in the pipeline)` for each of `stages` stages, each on a thread of
/// its own, as each would run in a process of its own; their results by stage.
pub fn in_processes<T: Send + 'static>(
    stages: usize,
    run: impl Fn(usize, ProcessStages) -> Result<T> + Clone + Send + 'static,
) -> Vec<Result<T>> {
    let threads: Vec<_> = stage_comms(stages)
        .into_iter()
        .enumerate()
        .map(|(stage, comms)| {
            let run = run.clone();
            std::thread::spawn(move || -> Result<T> {
                let mut comms = comms.into_iter().map(|c| Box::new(c) as Box<dyn Communicator>);
                let world: Arc<dyn Communicator> = Arc::from(comms.next().unwrap());
                let processes = ProcessStages::new(world, || Ok(comms.next().unwrap()))?;
                run(stage, processes)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}
