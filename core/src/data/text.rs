//! Text for language models, read as nanoGPT reads it. A UTF-8 file becomes character ids
//! over its own sorted character set (nanoGPT's shakespeare_char), split 90/10 into training
//! and validation tokens; or nanoGPT's pre-tokenized `train.bin` / `val.bin` (little-endian
//! u16 ids, e.g. GPT-2's tokenizer) are memory-mapped as they are (`gpt2_text` tokenizes a
//! text with GPT-2's BPE into such a file). A sample is a window of `block`
//! tokens and the same window shifted by one as its targets (nanoGPT's `get_batch`); every
//! window start is a sample, so a shuffling sampler draws random windows, seeded and resumable.

use std::path::Path;
use std::sync::Arc;

use super::batch::{Batch, HostTensor};
use super::dataset::{Dataset, Sample};
use super::token_file::{self, MappedTokens};
use crate::dtype::HostVec;
use crate::error::{Error, Result};

/// The characters of a text, sorted: id `i` is the `i`-th.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
}

impl CharVocab {
    /// Every distinct character of `text`, sorted by code point.
    pub fn of(text: &str) -> CharVocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab { chars }
    }
    /// Vocabulary size: the number of distinct characters.
    pub fn len(&self) -> usize {
        self.chars.len()
    }
    /// True for the vocabulary of an empty text.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }
    /// The ids of `text`'s characters; a character outside the vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        text.chars()
            .enumerate()
            .map(|(at, c)| {
                self.chars.binary_search(&c).map(|i| i as u32).map_err(|_| {
                    Error::invalid(
                        "CharVocab::encode",
                        format!(
                            "character {c:?} (at {at}) is not in the vocabulary of {} characters",
                            self.len()
                        ),
                    )
                })
            })
            .collect()
    }
    /// The text of `ids`; an id past the vocabulary is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        ids.iter()
            .map(|&id| {
                self.chars.get(id as usize).copied().ok_or_else(|| {
                    Error::invalid(
                        "CharVocab::decode",
                        format!("id {id} is past the vocabulary of {} characters", self.len()),
                    )
                })
            })
            .collect()
    }
    /// The characters as one string, for a checkpoint's metadata; `from_chars` reads it back.
    pub fn chars(&self) -> String {
        self.chars.iter().collect()
    }
    /// The vocabulary `chars()` wrote, e.g. read back from a checkpoint's metadata.
    pub fn from_chars(chars: &str) -> CharVocab {
        CharVocab::of(chars)
    }
}

/// A token stream: ids in memory, or u16 ids in a memory-mapped file.
#[derive(Clone)]
enum Tokens {
    Ids(Arc<Vec<u32>>),
    Mapped(MappedTokens),
}

impl Tokens {
    fn len(&self) -> usize {
        match self {
            Tokens::Ids(ids) => ids.len(),
            Tokens::Mapped(mapped) => mapped.len(),
        }
    }
    fn extend(&self, range: std::ops::Range<usize>, out: &mut Vec<u32>) {
        match self {
            Tokens::Ids(ids) => out.extend_from_slice(&ids[range]),
            Tokens::Mapped(mapped) => mapped.extend(range, out),
        }
    }
}

/// Windows of `block` tokens of a token stream, with their next-token targets: every window
/// (for training), or windows that tile the stream (`tiled`, for validation: each token is
/// predicted once, in a full context, instead of `block` times).
pub struct TokenWindows {
    tokens: Tokens,
    block: usize,
    /// Tokens between the starts of consecutive windows.
    stride: usize,
}

impl TokenWindows {
    /// Windows of `block` over `tokens` (named `what` in errors); needs at least `block + 1`.
    pub fn new(tokens: Vec<u32>, block: usize, what: &str) -> Result<TokenWindows> {
        TokenWindows::over(Tokens::Ids(Arc::new(tokens)), block, what)
    }
    /// Windows of `block` over ids in a memory-mapped file (named `what` in errors), read from
    /// the map window by window; needs at least `block + 1` ids.
    pub fn mapped(tokens: MappedTokens, block: usize, what: &str) -> Result<TokenWindows> {
        TokenWindows::over(Tokens::Mapped(tokens), block, what)
    }
    fn over(tokens: Tokens, block: usize, what: &str) -> Result<TokenWindows> {
        if block == 0 {
            return Err(Error::invalid(
                "TokenWindows",
                "the block size must be at least 1 token",
            ));
        }
        if tokens.len() <= block {
            return Err(Error::data(
                what,
                format!(
                    "{} tokens: shorter than one block of {block} plus its next token; use a longer text or a smaller --block-size",
                    tokens.len()
                ),
            ));
        }
        Ok(TokenWindows {
            tokens,
            block,
            stride: 1,
        })
    }
    /// Windows that follow each other without overlap.
    pub fn tiled(self) -> TokenWindows {
        TokenWindows {
            stride: self.block,
            ..self
        }
    }
    /// The whole token stream the windows are cut from, copied (a mapped file's ids widened).
    pub fn tokens(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.tokens.len());
        self.tokens.extend(0..self.tokens.len(), &mut out);
        out
    }
    /// Tokens per window: the context length (nanoGPT's `block_size`).
    pub fn block(&self) -> usize {
        self.block
    }
}

impl Dataset for TokenWindows {
    fn len(&self) -> usize {
        (self.tokens.len() - self.block - 1) / self.stride + 1
    }
    fn get(&self, index: usize) -> Result<Sample> {
        Ok(self.get_batch(&[index])?.into_sample())
    }
    /// `[n, block]` inputs and `[n, block]` targets (u32 ids), in one pass.
    fn get_batch(&self, indices: &[usize]) -> Result<Batch> {
        let (n, block) = (indices.len(), self.block);
        let mut inputs = Vec::with_capacity(n * block);
        let mut targets = Vec::with_capacity(n * block);
        for &index in indices {
            let start = index * self.stride;
            if index >= self.len() {
                return Err(Error::data(
                    format!("text window {index}"),
                    format!("out of range: the text has {} windows of {block} tokens", self.len()),
                ));
            }
            self.tokens.extend(start..start + block, &mut inputs);
            self.tokens.extend(start + 1..start + 1 + block, &mut targets);
        }
        Ok(Batch {
            fields: vec![
                HostTensor::new(HostVec::U32(inputs), [n, block])?,
                HostTensor::new(HostVec::U32(targets), [n, block])?,
            ],
            indices: indices.to_vec(),
        })
    }
}

/// Bytes in memory per byte of a character file while it becomes windows: the text, its ids
/// (u32), and the training and validation copies of them.
const CHAR_TEXT_EXPANSION: u64 = 1 + 4 + 4;

/// The text of a UTF-8 file; a file that is empty or not UTF-8, or too large for this machine's
/// memory, is an error saying so.
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::limits::read_file_that_fits(
        path,
        CHAR_TEXT_EXPANSION,
        "train on a part of it, or tokenize it into nanoGPT's train.bin and val.bin (u16 ids, memory-mapped)",
    )?;
    parse_text(bytes, &path.display().to_string())
}

/// The text in a file's contents `bytes` (named `what` in errors), as [`read_text`] checks it:
/// empty or not UTF-8 is an error saying so.
pub fn parse_text(bytes: Vec<u8>, what: &str) -> Result<String> {
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::data(
            what,
            format!(
                "not UTF-8 text: invalid bytes at offset {}; convert it to UTF-8 (or give nanoGPT's train.bin / val.bin)",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    if text.is_empty() {
        return Err(Error::data(
            what,
            "the file is empty: a language model needs text to learn",
        ));
    }
    Ok(text)
}

/// A UTF-8 text file as (vocabulary, training windows, validation windows): the first 90% of
/// its characters train, the rest validate, as nanoGPT splits them (the validation windows
/// tiled).
pub fn char_text(path: &Path, block: usize) -> Result<(CharVocab, TokenWindows, TokenWindows)> {
    char_windows(&read_text(path)?, &path.display().to_string(), block)
}

/// As [`char_text`], for a text already read (named `what` in errors).
pub fn char_windows(text: &str, what: &str, block: usize) -> Result<(CharVocab, TokenWindows, TokenWindows)> {
    let vocab = CharVocab::of(text);
    let ids = vocab.encode(text)?;
    let split = ids.len() * 9 / 10;
    let train = TokenWindows::new(
        ids[..split].to_vec(),
        block,
        &format!("{what} (its first 90%, for training)"),
    )?;
    let val = TokenWindows::new(
        ids[split..].to_vec(),
        block,
        &format!("{what} (its last 10%, for validation)"),
    )?
    .tiled();
    Ok((vocab, train, val))
}

/// nanoGPT's pre-tokenized `train.bin` and `val.bin` in `dir`: little-endian u16 ids, each
/// below `vocab_size`, memory-mapped.
pub fn token_bins(dir: &Path, block: usize, vocab_size: usize) -> Result<(TokenWindows, TokenWindows)> {
    let open = |name: &str| -> Result<TokenWindows> {
        let path = dir.join(name);
        let what = path.display().to_string();
        TokenWindows::mapped(MappedTokens::open(&path, 0, vocab_size, &what)?, block, &what)
    };
    Ok((open("train.bin")?, open("val.bin")?.tiled()))
}

/// The windows of `block` tokens over the contents of a `.bin` file already in memory (named
/// `what` in errors), checked as [`token_bins`] checks a file: little-endian u16 ids, each
/// below `vocab_size`.
pub fn token_windows(bytes: &[u8], what: &str, block: usize, vocab_size: usize) -> Result<TokenWindows> {
    token_file::check_ids(bytes, vocab_size, what)?;
    let ids = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect();
    TokenWindows::new(ids, block, what)
}
