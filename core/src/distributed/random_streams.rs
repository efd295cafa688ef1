//! Every replica draws from rank 0's random streams (Dropout's), as it starts from rank 0's
//! weights: with draws keyed to the sample (`rng::BatchWindow`), the replicas then draw for each
//! sample what one device would, whatever seed each replica's setup was built with.

use std::sync::Arc;

use crate::backend::Communicator;
use crate::device::Device;
use crate::distributed::all_gather_values;
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// Bits per f32 value: every collective engine carries f32, which holds 16-bit pieces exactly.
const PIECE_BITS: u32 = 16;
const PIECES: usize = (u64::BITS / PIECE_BITS) as usize;

/// Puts each of `streams` at rank 0's state (seed and counter); every rank takes part, and all
/// must hold as many streams.
pub(crate) fn adopt_rank0_streams(comm: &dyn Communicator, device: &Device, streams: &[Arc<Generator>]) -> Result<()> {
    let counts = all_gather_values(comm, device, vec![streams.len() as f32])?;
    if counts.iter().any(|&c| c != counts[0]) {
        return Err(Error::invalid(
            "data parallel",
            format!(
                "the replicas' models hold different numbers of random streams (Dropout generators), by rank {counts:?}; \
                 build every replica's model the same way"
            ),
        ));
    }
    if streams.is_empty() {
        return Ok(());
    }
    let words: Vec<u64> = streams
        .iter()
        .flat_map(|g| {
            let (seed, counter) = g.state();
            [seed, counter]
        })
        .collect();
    let pieces: Vec<f32> = words.iter().flat_map(|&w| to_pieces(w)).collect();
    let len = pieces.len();
    let buffer = Tensor::from_host(HostVec::F32(pieces), [len], device)?;
    comm.broadcast(buffer.buffer(), 0)?;
    let received = buffer.to_vec::<f32>()?;
    let words: Vec<u64> = received.chunks_exact(PIECES).map(from_pieces).collect();
    for (g, state) in streams.iter().zip(words.chunks_exact(2)) {
        g.restore(state[0], state[1]);
    }
    Ok(())
}

fn to_pieces(word: u64) -> [f32; PIECES] {
    std::array::from_fn(|i| ((word >> (PIECE_BITS * i as u32)) & 0xFFFF) as f32)
}

fn from_pieces(pieces: &[f32]) -> u64 {
    pieces
        .iter()
        .enumerate()
        .fold(0, |word, (i, &p)| word | ((p as u64) << (PIECE_BITS * i as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_survives_its_f32_pieces() {
        for word in [0, 1, 0xFFFF, 0x1_0000, u64::MAX, 0x0123_4567_89AB_CDEF] {
            assert_eq!(from_pieces(&to_pieces(word)), word);
        }
    }
}
