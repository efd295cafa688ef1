//! A weight two stages of a pipeline both use (a GPT's token embedding, which its head reuses):
//! as Megatron does, the first stage keeps the weight and the later one gets a copy of its own,
//! equal at the start; the pipeline sums the two gradients before the optimizer steps, so both
//! copies take the same step and stay equal.

use std::collections::HashMap;

use super::module::{Module, ModuleExt};
use super::sequential::Sequential;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One weight held by two stages: the original on `first`, a copy on `copy`, each named as its
/// stage names it (`transformer.wte.weight` and `lm_head.weight` for a GPT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiedWeight {
    /// The stage (counted in the whole pipeline) that holds the original, and its name there.
    pub first: (usize, String),
    /// The later stage that holds the copy, and the copy's name there; a global gradient norm
    /// leaves the copy out, so the weight counts once.
    pub copy: (usize, String),
}

impl TiedWeight {
    /// This tie's name in `stage`, when `stage` holds one of its two copies.
    pub fn name_in(&self, stage: usize) -> Option<&str> {
        [&self.first, &self.copy]
            .into_iter()
            .find(|(s, _)| *s == stage)
            .map(|(_, name)| name.as_str())
    }

    /// The other stage holding this weight, seen from `stage` (one of the two).
    pub fn other_stage(&self, stage: usize) -> usize {
        if self.first.0 == stage {
            self.copy.0
        } else {
            self.first.0
        }
    }
}

/// Gives every parameter that several of `parts` hold (one tensor, shared) a copy of its own
/// in each part after the first that holds it, and returns the ties between them; `parts` are
/// the consecutive stages of a split, stage `i` being `parts[i]`.
pub(super) fn untie(parts: &mut [Sequential]) -> Result<Vec<TiedWeight>> {
    let mut owner: HashMap<u64, (usize, String)> = HashMap::new();
    let mut ties = Vec::new();
    for (stage, part) in parts.iter_mut().enumerate() {
        // The copy of each shared tensor this part holds, made once however often the part visits it.
        let mut copies: HashMap<u64, Tensor> = HashMap::new();
        for (name, p) in part.named_parameters() {
            match owner.get(&p.id()) {
                None => {
                    owner.insert(p.id(), (stage, name));
                }
                Some(first) if ties.iter().any(|t: &TiedWeight| t.first == *first) => {
                    return Err(Error::invalid(
                        "pipeline stages",
                        format!(
                            "{} is used by three or more stages; a weight may be shared by two stages at most: put its layers on fewer stages",
                            first.1
                        ),
                    ));
                }
                Some(first) => {
                    ties.push(TiedWeight {
                        first: first.clone(),
                        copy: (stage, name),
                    });
                    copies.insert(p.id(), p.deep_copy()?.requires_grad(true));
                }
            }
        }
        if !copies.is_empty() {
            part.map_tensors(&mut |t| Ok(copies.get(&t.id()).unwrap_or(t).clone()))?;
        }
    }
    Ok(ties)
}
