//! The ranges of the command line's numbers, in one place: each flag's check says the flag, the
//! value and the range in one line. The machine's own limits (threads) come from
//! `lockstep_core::limits`, which the library's builders check too.

use std::fmt::Display;
use std::ops::RangeInclusive;

use anyhow::bail;

/// Samples in one batch, and other per-step counts of samples: 16M 28x28 images are 50 GB.
pub const MOST_SAMPLES: usize = 1 << 24;
/// A layer's width, a GPT's embedding: a million makes matrices of 4 TB.
pub const MOST_WIDTH: usize = 1 << 20;
/// A square image's side: 4096² RGB in f32 is 200 MB per image.
pub const MOST_PIXELS: usize = 4096;
/// A GPT's layers or heads.
pub const MOST_LAYERS: usize = 4096;
/// Tokens of context: a million.
pub const MOST_TOKENS: usize = 1 << 20;
/// Token ids of train.bin are u16.
pub const MOST_VOCAB: usize = 1 << 16;
/// Pipeline stages and micro-batches, machines in a job: far past what runs, short of what
/// overflows a product of two.
pub const MOST_PARTS: usize = 1 << 16;
/// A bucket of gradients (MiB): 64 GiB.
pub const MOST_BUCKET_MIB: f64 = 65536.0;
/// Seconds any wait may last: a week. Longer overflows a deadline (`Instant + Duration`).
pub const MOST_SECONDS: u64 = 7 * 24 * 3600;
/// Learning rates, weight decay, temperatures: finite and at most this. Far past any that
/// learns (a run at 1e10 diverges, and `--on-nan` handles it); what is refused is the value
/// whose products overflow before the first step can say so (1e300, inf).
pub const MOST_RATE: f64 = 1e12;
/// The largest memory limit in MiB: 1 PiB, past any device.
pub const MOST_MEMORY_MIB: u64 = 1 << 30;

/// `value` of `flag` within `range`, else the one-line refusal.
pub fn within<T: PartialOrd + Display>(flag: &str, value: T, range: RangeInclusive<T>) -> anyhow::Result<()> {
    if !range.contains(&value) {
        bail!(
            "{flag} {value} is out of range: give {} to {}",
            range.start(),
            range.end()
        );
    }
    Ok(())
}

/// Every element of a list flag (`--hidden 512,512`) within `range`.
pub fn each_within(flag: &str, values: &[usize], range: RangeInclusive<usize>) -> anyhow::Result<()> {
    values.iter().try_for_each(|&v| within(flag, v, range.clone()))
}

/// A real-valued flag: finite and within `range` (NaN is within no range).
pub fn real(flag: &str, value: f64, range: RangeInclusive<f64>) -> anyhow::Result<()> {
    if !value.is_finite() || !range.contains(&value) {
        bail!(
            "{flag} {value} is out of range: give a number from {} to {}",
            range.start(),
            range.end()
        );
    }
    Ok(())
}

/// A real-valued flag that must be above zero: finite, positive and at most `most`.
pub fn positive(flag: &str, value: f64, most: f64) -> anyhow::Result<()> {
    if !(value.is_finite() && value > 0.0 && value <= most) {
        bail!(
            "{flag} {} is out of range: give a positive number up to {}",
            shown(value),
            shown(most)
        );
    }
    Ok(())
}

/// A real number as a person writes it: whole numbers without a fraction, others in the
/// shortest text that reads back (1e308, not 309 digits).
fn shown(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value:?}")
    }
}

/// Threads (or processes) for `flag`, against what this machine can run.
pub fn threads(flag: &str, count: usize, least: usize) -> anyhow::Result<()> {
    let most = lockstep_core::limits::most_threads();
    if count < least || count > most {
        bail!(
            "{flag} {count} is out of range: give {least} to {most} (four per logical CPU of this machine, at least 64)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_flag_the_value_and_the_range() {
        let msg = within("--micro-batches", 0, 1..=8).unwrap_err().to_string();
        assert_eq!(msg, "--micro-batches 0 is out of range: give 1 to 8");
        within("--micro-batches", 8, 1..=8).unwrap();
        let msg = threads("--workers", 100_000, 0).unwrap_err().to_string();
        assert!(msg.starts_with("--workers 100000 is out of range: give 0 to "), "{msg}");
        threads("--workers", 0, 0).unwrap();
    }

    #[test]
    fn nan_and_infinity_are_never_within_range() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0] {
            assert!(positive("--lr", bad, MOST_RATE).is_err(), "{bad}");
        }
        assert!(real("--momentum", f64::NAN, 0.0..=1.0).is_err());
        positive("--lr", 0.1, MOST_RATE).unwrap();
        real("--momentum", 0.0, 0.0..=1.0).unwrap();
    }
}
