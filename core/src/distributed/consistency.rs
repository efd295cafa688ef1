//! Before replicas exchange anything, they check they hold the same model: the same number of
//! parameters with the same names, shapes and dtypes, in the same order. Without the check a
//! replica built from other flags would average unrelated tensors, or hang in a collective of
//! another size. Every rank sees the same gathered fingerprints, so all refuse together.

use super::all_gather_values;
use crate::backend::Communicator;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What a parameter must match across replicas, as text (hashed for the exchange).
fn describe(name: &str, p: &Tensor) -> String {
    format!("`{name}` {:?} {}", p.shape().dims(), p.dtype())
}

/// FNV-1a: a stable 32-bit fingerprint (std's hasher may differ between builds of the binary).
fn fingerprint(text: &str) -> u32 {
    text.bytes()
        .fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Refuses, on every rank, a run whose replicas differ from rank 0's model, naming the first
/// parameter that differs.
pub(crate) fn verify_same_model(named: &[(String, Tensor)], comm: &dyn Communicator) -> Result<()> {
    let Some((_, first)) = named.first() else {
        return Ok(());
    };
    let device = first.device();
    let (rank, world) = (comm.rank(), comm.world_size());
    let counts = all_gather_values(comm, device, vec![named.len() as u32])?;
    if let Some(r) = (1..world).find(|&r| counts[r] != counts[0]) {
        return Err(Error::invalid(
            "data parallel",
            format!(
                "rank {r} has {} parameters and rank 0 has {}: every replica must build the same model (same --model and sizes)",
                counts[r], counts[0]
            ),
        ));
    }
    let mine: Vec<u32> = named.iter().map(|(n, p)| fingerprint(&describe(n, p))).collect();
    let all = all_gather_values(comm, device, mine)?;
    let n = named.len();
    for i in 0..n {
        if let Some(r) = (1..world).find(|&r| all[r * n + i] != all[i]) {
            let (name, p) = &named[i];
            return Err(Error::invalid(
                "data parallel",
                format!(
                    "parameter {i} differs between rank 0 and rank {r} (on this rank, {rank}, it is {}): every replica must build the same model",
                    describe(name, p)
                ),
            ));
        }
    }
    Ok(())
}
