//! GPT-2's byte-pair encoding, as OpenAI's tiktoken encodes `gpt2` (nanoGPT's prepare.py uses
//! it): the r50k_base ranks, GPT-2's splitting pattern and `<|endoftext|>` as id 50256. The
//! ranks ship inside the tiktoken-rs crate, so nothing is downloaded.

use tiktoken_rs::CoreBPE;

use crate::error::{Error, Result};

/// GPT-2's vocabulary: 50,000 merges, 256 bytes and `<|endoftext|>`.
pub const VOCAB_SIZE: usize = 50257;
/// The id of `<|endoftext|>`, which separates documents.
pub const END_OF_TEXT: u32 = 50256;
/// The tokenizer's name in a checkpoint's hyperparameters and on the command line.
pub const NAME: &str = "gpt2";
/// The longest run of whitespace `encode` takes: GPT-2's pattern backtracks over such a run,
/// and a run of a million overflowed the matcher's stack (700,000 did not).
pub const MOST_WHITESPACE_RUN: usize = 500_000;

/// GPT-2's tokenizer; cheap to make after the first (the ranks are parsed once per process).
#[derive(Clone, Copy)]
pub struct Gpt2Tokenizer {
    bpe: &'static CoreBPE,
}

impl Gpt2Tokenizer {
    /// The tokenizer, its ranks parsed on first use (about 0.1 s).
    pub fn new() -> Gpt2Tokenizer {
        Gpt2Tokenizer {
            bpe: tiktoken_rs::r50k_base_singleton(),
        }
    }
    /// The ids of `text`, as tiktoken's `encode_ordinary`: the text `<|endoftext|>` is
    /// encoded as its characters, not as the special token. A run of whitespace longer than
    /// [`MOST_WHITESPACE_RUN`] is an error saying where.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        check_whitespace_runs(text)?;
        Ok(self.bpe.encode_ordinary(text))
    }
    /// The text of `ids`. Ids that end inside a character (a sample cut short) leave U+FFFD
    /// in its place, as tiktoken's `decode(errors="replace")`; an id past the vocabulary is an
    /// error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let bytes = self.bpe.decode_bytes(ids).map_err(|e| {
            Error::invalid(
                "Gpt2Tokenizer::decode",
                format!("id {} is past GPT-2's vocabulary of {VOCAB_SIZE}", e.token),
            )
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Default for Gpt2Tokenizer {
    fn default() -> Self {
        Gpt2Tokenizer::new()
    }
}

/// Refuses a run of whitespace past [`MOST_WHITESPACE_RUN`] characters, naming its length and
/// where it starts.
fn check_whitespace_runs(text: &str) -> Result<()> {
    let (mut start, mut run) = (0, 0);
    let mut longest = (0, 0);
    for (at, c) in text.char_indices() {
        if !c.is_whitespace() {
            run = 0;
            continue;
        }
        if run == 0 {
            start = at;
        }
        run += 1;
        if run > longest.1 {
            longest = (start, run);
        }
    }
    let (at, run) = longest;
    if run > MOST_WHITESPACE_RUN {
        return Err(Error::invalid(
            "Gpt2Tokenizer::encode",
            format!(
                "a run of {run} whitespace characters (at byte {at}) is more than GPT-2's tokenizer takes ({MOST_WHITESPACE_RUN}); shorten it"
            ),
        ));
    }
    Ok(())
}
