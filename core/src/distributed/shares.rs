//! How a global batch is split over devices of different speeds: shares proportional to the
//! devices' measured throughput, in whole samples, at least one each. Pure arithmetic on values
//! every rank holds identically (gathered), so every rank reaches the same shares on its own.

use crate::error::{Error, Result};

/// A re-balance must promise a step at least this much faster, so measurement noise does not
/// make the loaders restart for nothing.
pub(crate) const MIN_GAIN: f64 = 0.05;

/// Splits `total` samples over the ranks in proportion to `rates` (samples per second). A rank
/// whose part would be under one sample gets one and the rest is split over the others; parts
/// are rounded down and the samples left go to the largest remainders (ties to the lower rank),
/// so the shares always sum to `total`.
pub(crate) fn proportional_shares(rates: &[f64], total: usize) -> Result<Vec<usize>> {
    let n = rates.len();
    if n == 0 || total < n {
        return Err(Error::invalid(
            "proportional_shares",
            format!("{total} samples cannot give each of {n} ranks at least one"),
        ));
    }
    if let Some(bad) = rates.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
        return Err(Error::invalid(
            "proportional_shares",
            format!("throughputs must be positive and finite, got {bad} in {rates:?}"),
        ));
    }
    // Pin at one sample every rank too slow to earn one, until the rest all earn one.
    let mut pinned = vec![false; n];
    let quotas = loop {
        let free_rate: f64 = (0..n).filter(|&r| !pinned[r]).map(|r| rates[r]).sum();
        let budget = (total - pinned.iter().filter(|&&p| p).count()) as f64;
        let quotas: Vec<f64> = (0..n)
            .map(|r| if pinned[r] { 1.0 } else { budget * rates[r] / free_rate })
            .collect();
        let under: Vec<usize> = (0..n).filter(|&r| !pinned[r] && quotas[r] < 1.0).collect();
        if under.is_empty() {
            break quotas;
        }
        under.into_iter().for_each(|r| pinned[r] = true);
    };
    let mut shares: Vec<usize> = quotas.iter().map(|q| q.floor() as usize).collect();
    let left = total.saturating_sub(shares.iter().sum());
    let mut by_remainder: Vec<usize> = (0..n).collect();
    // A stable sort: equal remainders keep rank order.
    by_remainder.sort_by(|&a, &b| (quotas[b] - quotas[b].floor()).total_cmp(&(quotas[a] - quotas[a].floor())));
    for &r in by_remainder.iter().take(left) {
        shares[r] += 1;
    }
    Ok(shares)
}

/// Seconds a synchronous step takes with `shares` at `rates`: the slowest rank's.
pub(crate) fn step_seconds(shares: &[usize], rates: &[f64]) -> f64 {
    shares
        .iter()
        .zip(rates)
        .map(|(&s, &rate)| s as f64 / rate)
        .fold(0.0, f64::max)
}

/// The shares `rates` call for, when they make a step at least `MIN_GAIN` faster than
/// `current`; `None` keeps `current` (also when some rank measured nothing usable).
pub(crate) fn rebalanced(current: &[usize], rates: &[f64]) -> Result<Option<Vec<usize>>> {
    if rates.len() != current.len() || rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Ok(None);
    }
    let proposed = proportional_shares(rates, current.iter().sum())?;
    let faster = step_seconds(&proposed, rates) < step_seconds(current, rates) * (1.0 - MIN_GAIN);
    Ok((faster && proposed != current).then_some(proposed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_rates_and_sum_to_the_total() {
        assert_eq!(proportional_shares(&[3.0, 1.0], 16).unwrap(), vec![12, 4]);
        assert_eq!(proportional_shares(&[1.0, 1.0, 1.0], 10).unwrap(), vec![4, 3, 3]);
        assert_eq!(proportional_shares(&[2.0, 1.0, 1.0], 128).unwrap(), vec![64, 32, 32]);
        // 7 * (5, 3, 2) / 10 = 3.5, 2.1, 1.4: floors 3, 2, 1 and the one left to the largest remainder.
        assert_eq!(proportional_shares(&[5.0, 3.0, 2.0], 7).unwrap(), vec![4, 2, 1]);
        for total in [3, 17, 128, 1000] {
            let s = proportional_shares(&[0.3, 7.0, 1.1], total).unwrap();
            assert_eq!(s.iter().sum::<usize>(), total, "{s:?}");
        }
    }

    #[test]
    fn every_rank_keeps_at_least_one_sample() {
        // The slow rank's quota (0.1) is under one: it keeps one, the other takes the rest.
        assert_eq!(proportional_shares(&[1000.0, 1.0], 100).unwrap(), vec![99, 1]);
        assert_eq!(proportional_shares(&[1.0, 1e9, 1.0], 3).unwrap(), vec![1, 1, 1]);
        // Pinning rank 0 (quota 0.11) leaves rank 1 under one (1.11 -> 0.86): it is pinned too.
        assert_eq!(proportional_shares(&[0.1, 1.0, 2.5], 4).unwrap(), vec![1, 1, 2]);
    }

    #[test]
    fn ties_go_to_the_lower_rank() {
        assert_eq!(proportional_shares(&[1.0, 1.0], 3).unwrap(), vec![2, 1]);
        assert_eq!(proportional_shares(&[1.0, 2.0, 1.0], 6).unwrap(), vec![2, 3, 1]);
        assert_eq!(proportional_shares(&[1.0, 1.0, 1.0], 5).unwrap(), vec![2, 2, 1]);
    }

    #[test]
    fn impossible_splits_are_refused() {
        assert!(proportional_shares(&[1.0, 1.0, 1.0], 2).is_err());
        assert!(proportional_shares(&[], 4).is_err());
        assert!(proportional_shares(&[1.0, 0.0], 4).is_err());
        assert!(proportional_shares(&[1.0, f64::NAN], 4).is_err());
    }

    #[test]
    fn a_rebalance_needs_a_real_gain() {
        // A rank three times slower: 8/8 takes 8 s, 12/4 takes 4 s.
        assert_eq!(rebalanced(&[8, 8], &[3.0, 1.0]).unwrap(), Some(vec![12, 4]));
        // Noise: 64/64 at rates 1.02 : 1 is within MIN_GAIN of the best split.
        assert_eq!(rebalanced(&[64, 64], &[1.02, 1.0]).unwrap(), None);
        assert_eq!(rebalanced(&[12, 4], &[3.0, 1.0]).unwrap(), None, "already balanced");
        assert_eq!(rebalanced(&[8, 8], &[3.0, 0.0]).unwrap(), None, "nothing measured");
        assert_eq!(step_seconds(&[12, 4], &[3.0, 1.0]), 4.0);
    }
}
