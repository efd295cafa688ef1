//! A training run in one checkpoint file and back: model and optimizer tensors, and the trainer
//! state, optimizer scalars and optimizer name as metadata.

use std::collections::BTreeMap;
use std::path::Path;

use super::{FORMAT, FORMAT_KEY, TensorFile, host_to_device, load_metadata, save_tensors};
use crate::error::{Error, Result};
use crate::nn::ModuleExt;
use crate::optim::{OptimizerState, SchedulerState};
use crate::train::TrainingSetup;
use crate::train::state::TrainerState;

pub(crate) const OPTIMIZER_PREFIX: &str = "optimizer.";
const STATE_KEY: &str = "lockstep.trainer_state";
const SCALARS_KEY: &str = "lockstep.optimizer_scalars";
const OPTIMIZER_KEY: &str = "lockstep.optimizer";
const HPARAMS_KEY: &str = "lockstep.hparams";

/// One checkpoint file: model tensors by PyTorch name, optimizer tensors under `optimizer.`,
/// and the trainer state, optimizer scalars and optimizer name as metadata.
pub(crate) fn write(path: &Path, setup: &TrainingSetup, state: &TrainerState) -> Result<()> {
    let mut tensors = setup.model.state_dict();
    let opt = setup.optimizer.try_state()?;
    tensors.extend(
        opt.tensors
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t.clone())),
    );
    let meta = BTreeMap::from([
        (FORMAT_KEY.to_string(), FORMAT.to_string()),
        (STATE_KEY.to_string(), to_json(state)),
        (SCALARS_KEY.to_string(), to_json(&opt.scalars)),
        (OPTIMIZER_KEY.to_string(), setup.optimizer.name().to_string()),
        (HPARAMS_KEY.to_string(), to_json(&setup.hparams)),
    ]);
    save_tensors(path, &tensors, meta)
}

/// Loads model, optimizer, scheduler and random streams from the checkpoint `file` (named
/// `what` in errors) into `setup`, and returns the trainer state it holds (callbacks and strategy
/// are the caller's).
pub(crate) fn restore(setup: &mut TrainingSetup, file: &TensorFile, what: &str) -> Result<TrainerState> {
    if file.metadata.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
        return Err(Error::data(
            what,
            "not a Lockstep checkpoint (no trainer state inside); to start from plain weights use --init-weights",
        ));
    }
    let state: TrainerState = parse_meta(&file.metadata, STATE_KEY, what)?;
    let scalars: Vec<(String, f64)> = parse_meta(&file.metadata, SCALARS_KEY, what)?;
    let saved_optimizer = file.metadata.get(OPTIMIZER_KEY).cloned().unwrap_or_default();
    if saved_optimizer != setup.optimizer.name() {
        return Err(Error::data(
            what,
            format!(
                "it was saved with optimizer {saved_optimizer}, this run uses {}",
                setup.optimizer.name()
            ),
        ));
    }
    // Checked before anything is loaded into `setup`. Seeds are compared by `fit` with the
    // run's other settings (`resume_check`).
    let streams = setup.random_streams();
    if state.generators.len() != streams.len() {
        return Err(Error::data(
            what,
            format!(
                "it carries {} random streams, this run has {}",
                state.generators.len(),
                streams.len()
            ),
        ));
    }
    let device = setup.device.clone();
    let mut model_tensors = Vec::new();
    let mut optimizer_tensors = Vec::new();
    for (name, t) in &file.tensors {
        let on_device = host_to_device(t, t.data.dtype(), &device)?;
        match name.strip_prefix(OPTIMIZER_PREFIX) {
            Some(rest) => optimizer_tensors.push((rest.to_string(), on_device)),
            None => model_tensors.push((name.clone(), on_device)),
        }
    }
    setup
        .model
        .load_state_dict(&model_tensors)
        .map_err(|e| Error::data(what, format!("does not fit this model: {e}")))?;
    setup.optimizer.load_state(&OptimizerState {
        tensors: optimizer_tensors,
        scalars,
    })?;
    if let (Some(sched), Some((base_lr, last_epoch))) = (setup.scheduler.as_mut(), state.scheduler) {
        sched.load_state(SchedulerState { base_lr, last_epoch }, setup.optimizer.as_mut())?;
    }
    // A stream keeps its own seed: `fit` refuses another seed than the checkpoint's unless the
    // run accepts it, and then goes on with its own seed from the checkpoint's position.
    for (g, &(_, counter)) in streams.iter().zip(&state.generators) {
        g.restore(g.seed(), counter);
    }
    Ok(state)
}

/// The hyperparameters a checkpoint was trained with (`TrainingSetup::hparams`, as Lightning
/// keeps `hparams` in its checkpoints): what a program needs to rebuild the model it holds.
/// Reads the file's header only.
pub fn hparams(path: &Path) -> Result<BTreeMap<String, String>> {
    let metadata = load_metadata(path)?;
    let what = path.display().to_string();
    if metadata.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
        return Err(Error::data(what, "not a Lockstep checkpoint (no trainer state inside)"));
    }
    parse_meta(&metadata, HPARAMS_KEY, &what)
}

fn parse_meta<T: serde::de::DeserializeOwned>(meta: &BTreeMap<String, String>, key: &str, what: &str) -> Result<T> {
    let raw = meta
        .get(key)
        .ok_or_else(|| Error::data(what.to_string(), format!("metadata `{key}` is missing")))?;
    serde_json::from_str(raw).map_err(|e| Error::data(what.to_string(), format!("metadata `{key}` is unreadable: {e}")))
}

/// Serialises to a JSON string (a serialisation failure here would be a bug in our types).
fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("\"unserialisable: {e}\""))
}
