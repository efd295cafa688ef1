//! How a benchmark is timed: warm-up runs, then timed repetitions until both a minimum count and
//! a minimum duration are reached; the median repetition is reported. The PyTorch peer receives
//! the same numbers, so both sides are timed by one rule.

use std::time::Instant;

use serde::Serialize;

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Timing {
    pub warmup: usize,
    pub min_reps: usize,
    pub max_reps: usize,
    pub min_seconds: f64,
}

/// The median and the number of timed repetitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measured {
    pub median_s: f64,
    pub reps: usize,
}

impl Timing {
    /// Times `rep`, which must finish its device work (synchronize) before returning.
    pub fn measure(&self, mut rep: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Measured> {
        for _ in 0..self.warmup {
            rep()?;
        }
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < self.max_reps
            && (times.len() < self.min_reps || start.elapsed().as_secs_f64() < self.min_seconds)
        {
            let t = Instant::now();
            rep()?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(Measured {
            median_s: median(&mut times),
            reps: times.len(),
        })
    }
}

/// The middle value (the mean of the two middle ones for an even count); sorts `times`.
pub fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    match times.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => times[n / 2],
        n => (times[n / 2 - 1] + times[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn runs_warmup_then_at_least_min_reps() {
        let mut calls = 0;
        let t = Timing {
            warmup: 2,
            min_reps: 3,
            max_reps: 10,
            min_seconds: 0.0,
        };
        let m = t.measure(|| {
            calls += 1;
            Ok(())
        });
        assert_eq!(m.map(|m| m.reps).ok(), Some(3));
        assert_eq!(calls, 5);
    }
}
