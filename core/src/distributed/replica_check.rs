//! Replicas that step on their own drift apart where their devices round differently: FMA
//! contraction, division accuracy and denormal flushing differ between vendors, so a run over a
//! CPU, a wgpu GPU and a CUDA GPU can diverge silently even though every replica applies the
//! same averaged gradients. Every N steps each replica fingerprints its parameters' bits; the
//! fingerprints are gathered, so every rank sees the same verdict and acts on it together.

use super::all_gather_values;
use crate::backend::Communicator;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What a run does when its replicas' parameters no longer agree bit for bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDrift {
    /// Every replica stops with an error naming the first parameter that differs, the rank and
    /// how far apart the values are.
    #[default]
    Stop,
    /// Rank 0 prints a warning with the same facts and every replica takes rank 0's parameters
    /// (optimizer state stays each replica's own).
    Rebroadcast,
}

/// A replica consistency check every `every_n_steps` optimizer steps (`--check-replicas-every`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaCheck {
    /// Optimizer steps between checks; each check reads every parameter back to the host once.
    pub every_n_steps: u64,
    /// What a difference does.
    pub on_drift: OnDrift,
}

impl ReplicaCheck {
    /// Whether the check runs after optimizer step `step` (counted from 1).
    pub fn due(&self, step: u64) -> bool {
        self.every_n_steps > 0 && step.is_multiple_of(self.every_n_steps)
    }
}

/// The first parameter that differs between rank 0 and another rank.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Drift {
    /// The parameter's name (`layer1.0.conv1.weight`).
    pub parameter: String,
    /// The lowest rank whose copy differs from rank 0's.
    pub rank: usize,
    /// The largest |rank's value − rank 0's value| over the parameter's elements.
    pub max_abs_difference: f64,
}

impl Drift {
    /// The sentence a log or an error shows, after "at step N".
    pub fn describe(&self) -> String {
        format!(
            "parameter `{}` on rank {} differs from rank 0's by up to {:.3e}",
            self.parameter, self.rank, self.max_abs_difference
        )
    }
}

/// A 64-bit FNV-1a over a parameter's values (widened to f64, which is exact for every float
/// dtype), as two u32 words for the gather.
fn fingerprint(p: &Tensor) -> Result<[u32; 2]> {
    let mix = |h: u64, x: f64| {
        x.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
    };
    let host = p.to_host()?;
    let hash = crate::map_host_vec!(&host, v => v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| mix(h, x.to_f64())));
    Ok([hash as u32, (hash >> 32) as u32])
}

/// The first parameter (in `named` order) whose bits differ between rank 0 and any other rank,
/// with how far apart the values are; every rank of `comm` must call it with the same model.
pub(crate) fn find_drift(named: &[(String, Tensor)], comm: &dyn Communicator) -> Result<Option<Drift>> {
    let Some((_, first)) = named.first() else {
        return Ok(None);
    };
    let device = first.device();
    let mine = named
        .iter()
        .map(|(_, p)| fingerprint(p))
        .collect::<Result<Vec<_>>>()?
        .concat();
    let all = all_gather_values(comm, device, mine)?;
    let words = 2 * named.len();
    let differs = |i: usize, r: usize| all[r * words + 2 * i..][..2] != all[2 * i..][..2];
    let world = comm.world_size();
    let Some((i, rank)) = (0..named.len()).find_map(|i| (1..world).find(|&r| differs(i, r)).map(|r| (i, r))) else {
        return Ok(None);
    };
    let (name, p) = &named[i];
    let distance = distance_from_rank_0(p, comm)?;
    let distances = all_gather_values(comm, device, vec![distance as f32])?;
    Ok(Some(Drift {
        parameter: name.clone(),
        rank,
        max_abs_difference: f64::from(distances[rank]),
    }))
}

/// The largest |p − rank 0's p| on this rank (0 on rank 0), rank 0's copy arriving by broadcast.
fn distance_from_rank_0(p: &Tensor, comm: &dyn Communicator) -> Result<f64> {
    let reference = p.deep_copy()?;
    comm.broadcast(reference.buffer(), 0)?;
    let (mine, theirs) = (p.to_host()?.to_f64_vec(), reference.to_host()?.to_f64_vec());
    Ok(mine.iter().zip(&theirs).fold(0.0, |m, (a, b)| {
        let d = (a - b).abs();
        if d.is_nan() { f64::INFINITY } else { m.max(d) }
    }))
}

/// Runs `check` after optimizer step `step`: a drift stops every rank with an error, or gives
/// every rank rank 0's parameters (rank 0 warning once), as `check.on_drift` says.
pub(crate) fn check_replicas(
    check: &ReplicaCheck,
    step: u64,
    named: &[(String, Tensor)],
    comm: &dyn Communicator,
) -> Result<()> {
    let Some(drift) = find_drift(named, comm)? else {
        return Ok(());
    };
    match check.on_drift {
        OnDrift::Stop => Err(Error::invalid(
            "replica check",
            format!(
                "at step {step} the replicas no longer agree: {}. Devices of different vendors round differently; \
                 pass --on-replica-drift rebroadcast (OnDrift::Rebroadcast) to carry on from rank 0's parameters",
                drift.describe()
            ),
        )),
        OnDrift::Rebroadcast => {
            if comm.rank() == 0 {
                eprintln!(
                    "warning: at step {step} {}; every replica now takes rank 0's parameters",
                    drift.describe()
                );
            }
            for (_, p) in named {
                comm.broadcast(p.buffer(), 0)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_is_due_on_multiples_of_its_period_only() {
        let check = ReplicaCheck {
            every_n_steps: 3,
            on_drift: OnDrift::Stop,
        };
        let due: Vec<u64> = (1..=9).filter(|&s| check.due(s)).collect();
        assert_eq!(due, [3, 6, 9]);
        assert!(
            !ReplicaCheck {
                every_n_steps: 0,
                ..check
            }
            .due(0)
        );
    }

    #[test]
    fn fingerprints_see_one_changed_bit() {
        let device = crate::Device::cpu();
        let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3], &device).unwrap();
        let b = Tensor::from_vec(vec![1.0f32, f32::from_bits(2.0f32.to_bits() + 1), 3.0], [3], &device).unwrap();
        assert_eq!(fingerprint(&a).unwrap(), fingerprint(&a.deep_copy().unwrap()).unwrap());
        assert_ne!(fingerprint(&a).unwrap(), fingerprint(&b).unwrap());
    }
}
