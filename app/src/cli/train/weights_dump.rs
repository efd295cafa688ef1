//! `--dump-weights DIR` (hidden; for tests): every replica writes its final weights to
//! `DIR/rank<R>.safetensors`, so a test can check that the replicas of a run agree bit for bit.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use lockstep_core::nn::{Module, ModuleExt};
use lockstep_core::train::checkpoint::save_tensors;

pub fn write(dir: &Path, rank: usize, model: &dyn Module) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create --dump-weights {}", dir.display()))?;
    let path = dir.join(format!("rank{rank}.safetensors"));
    save_tensors(&path, &model.state_dict(), BTreeMap::new())
        .with_context(|| format!("cannot write the weights to {}", path.display()))
}
