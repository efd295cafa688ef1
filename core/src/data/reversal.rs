//! The sequence-to-sequence task of the model-parallel example: reverse a sequence of 5 to 20
//! digits. Generated from a seed, so every run and every rank sees the same samples.
//!
//! A sample is `[input, target]`, both u32: the input is the source, left-padded to 20 (so an
//! encoder's last step is the source's last digit), then the decoder's teacher-forcing input
//! (start token, then the target shifted right), right-padded to 20; the target is the
//! reversed source, right-padded with `PAD`.

use super::batch::HostTensor;
use super::dataset::{Dataset, Sample};
use crate::dtype::HostVec;
use crate::error::Result;
use crate::rng::uniform_at;

/// The shortest source sequence, in digits.
pub const MIN_LEN: usize = 5;
/// The longest source sequence, in digits: the target's padded length and half the input's.
pub const MAX_LEN: usize = 20;
/// The digits 0-9, then padding and the decoder's start token.
pub const PAD: u32 = 10;
/// The decoder's start token, which begins the teacher-forcing half of the input.
pub const START: u32 = 11;
/// Token ids in all: the 10 digits, `PAD` and `START`.
pub const VOCAB: usize = 12;

/// The digit-reversal data set: samples of a u32 input `[40]` and target `[20]`, generated from a
/// seed.
pub struct Reversal {
    samples: usize,
    seed: u64,
}

impl Reversal {
    /// `samples` samples drawn from `seed`: the same seed gives the same data on every rank.
    pub fn new(samples: usize, seed: u64) -> Reversal {
        Reversal { samples, seed }
    }

    /// Sample `index`'s source digits.
    pub fn source(&self, index: usize) -> Vec<u32> {
        let draw = |j: usize| uniform_at(self.seed, index as u64 * 32, j);
        let len = MIN_LEN + (draw(0) * (MAX_LEN - MIN_LEN + 1) as f64) as usize;
        (0..len.min(MAX_LEN))
            .map(|j| (draw(j + 1) * 10.0) as u32 % 10)
            .collect()
    }
}

impl Dataset for Reversal {
    fn len(&self) -> usize {
        self.samples
    }
    fn get(&self, index: usize) -> Result<Sample> {
        let source = self.source(index);
        let target: Vec<u32> = source.iter().rev().copied().collect();
        let pad = |n: usize| std::iter::repeat_n(PAD, n);
        let mut input: Vec<u32> = pad(MAX_LEN - source.len()).chain(source.iter().copied()).collect();
        input.push(START);
        input.extend(&target[..target.len() - 1]);
        input.extend(pad(MAX_LEN - target.len()));
        let target_padded: Vec<u32> = target.iter().copied().chain(pad(MAX_LEN - target.len())).collect();
        Ok(vec![
            HostTensor::new(HostVec::U32(input), [2 * MAX_LEN])?,
            HostTensor::new(HostVec::U32(target_padded), [MAX_LEN])?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_reverse_their_source_and_pad_around_it() {
        let data = Reversal::new(100, 3);
        let lens: Vec<usize> = (0..100).map(|i| data.source(i).len()).collect();
        assert!(lens.iter().all(|&n| (MIN_LEN..=MAX_LEN).contains(&n)));
        assert!(lens.contains(&MIN_LEN) && lens.iter().any(|&n| n >= 18), "{lens:?}");
        let i = (0..100).find(|&i| data.source(i).len() == 6).unwrap();
        let source = data.source(i);
        let sample = data.get(i).unwrap();
        let HostVec::U32(input) = &sample[0].data else {
            panic!("u32 input")
        };
        let HostVec::U32(target) = &sample[1].data else {
            panic!("u32 target")
        };
        let reversed: Vec<u32> = source.iter().rev().copied().collect();
        assert_eq!(&input[..14], &[PAD; 14]);
        assert_eq!(&input[14..20], source.as_slice());
        assert_eq!(input[20], START);
        assert_eq!(&input[21..26], &reversed[..5]);
        assert_eq!(&input[26..], &[PAD; 14]);
        assert_eq!(&target[..6], reversed.as_slice());
        assert_eq!(&target[6..], &[PAD; 14]);
        // The same seed gives the same samples.
        assert_eq!(Reversal::new(100, 3).source(i), source);
        assert_ne!(Reversal::new(100, 4).source(i), source);
    }
}
