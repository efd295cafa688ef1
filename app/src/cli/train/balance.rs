//! Heterogeneous runs: over devices of different kinds (or with --balance), each replica's
//! share of every global batch follows its device's measured throughput, and its gradient is
//! weighted by that share, so the job still learns the global batch's mean.

use std::sync::Arc;

use lockstep_core::data::{BatchShares, DataLoader, DataLoaderConfig, Dataset, ShardedBatches};

use lockstep_flags::train::Args;

/// The shares a run of `world` replicas starts from when it balances: the global batch split
/// evenly, the remainder to the lowest ranks. None when it does not balance.
pub fn initial_shares(args: &Args, world: usize) -> anyhow::Result<Option<BatchShares>> {
    if world < 2 || !args.balances() {
        return Ok(None);
    }
    Ok(Some(BatchShares::equal(args.batch_size, world)?))
}

/// Replica `rank`'s training loader: its contiguous slice of every global batch, by `shares`
/// (equal ones where the run does not balance).
pub fn loader(
    args: &Args,
    train_set: Arc<dyn Dataset>,
    rank: usize,
    shares: &BatchShares,
    config: DataLoaderConfig,
) -> anyhow::Result<DataLoader> {
    let batches = ShardedBatches::new(train_set.len(), rank, !args.no_shuffle, args.seed, shares.clone())?;
    Ok(DataLoader::with_batch_sampler(train_set, Arc::new(batches), config)?)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn args(flags: &[&str]) -> clap::error::Result<Args> {
        Args::try_parse_from(["train"].iter().chain(flags))
    }

    #[test]
    fn devices_of_different_kinds_balance_unless_told_not_to() {
        let on = |flags: &[&str]| args(flags).unwrap().balances();
        assert!(on(&["--devices", "cuda:0,wgpu:0,cpu"]));
        assert!(!on(&["--devices", "cpu:0,cpu:1"]));
        assert!(!on(&["--devices", "cpu:0,wgpu:0", "--no-balance"]));
        assert!(on(&["--devices", "cpu:0,cpu:1", "--balance"]));
        assert!(args(&["--balance", "--no-balance"]).is_err());
    }

    #[test]
    fn a_balanced_batch_needs_only_a_sample_per_device() {
        let mixed = |batch: &str| args(&["--devices", "cpu:0,wgpu:0", "--batch-size", batch]).unwrap();
        assert!(mixed("127").validate().is_ok());
        let err = mixed("1").validate().unwrap_err().to_string();
        assert!(err.contains("cannot give each of 2 devices a sample"), "{err}");
        let even = args(&["--devices", "cpu:0,cpu:1", "--batch-size", "127"]).unwrap();
        assert!(even.validate().is_err(), "equal kinds still split evenly");
        let shares = initial_shares(&mixed("127"), 2).unwrap().unwrap();
        assert_eq!(shares.get(), vec![64, 63]);
        assert!(
            initial_shares(&mixed("127"), 1).unwrap().is_none(),
            "one replica never balances"
        );
    }
}
