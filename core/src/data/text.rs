//! Text for language models, read as nanoGPT reads it. A UTF-8 file becomes character ids
//! over its own sorted character set (nanoGPT's shakespeare_char), split 90/10 into training
//! and validation tokens; or nanoGPT's pre-tokenized `train.bin` / `val.bin` (little-endian
//! u16 ids, e.g. GPT-2's tokenizer) are read as they are. A sample is a window of `block`
//! tokens and the same window shifted by one as its targets (nanoGPT's `get_batch`); every
//! window start is a sample, so a shuffling sampler draws random windows, seeded and resumable.

use std::path::Path;
use std::sync::Arc;

use super::batch::{Batch, HostTensor};
use super::dataset::{Dataset, Sample};
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

/// Windows of `block` tokens of a token stream, with their next-token targets: every window
/// (for training), or windows that tile the stream (`tiled`, for validation: each token is
/// predicted once, in a full context, instead of `block` times).
pub struct TokenWindows {
    tokens: Arc<Vec<u32>>,
    block: usize,
    /// Tokens between the starts of consecutive windows.
    stride: usize,
}

impl TokenWindows {
    /// Windows of `block` over `tokens` (named `what` in errors); needs at least `block + 1`.
    pub fn new(tokens: Vec<u32>, block: usize, what: &str) -> Result<TokenWindows> {
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
            tokens: Arc::new(tokens),
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
    /// The whole token stream the windows are cut from.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
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
            inputs.extend_from_slice(&self.tokens[start..start + block]);
            targets.extend_from_slice(&self.tokens[start + 1..start + 1 + block]);
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
/// Per byte of a `.bin` file: the bytes and their ids (u32, one per two bytes).
const TOKEN_BIN_EXPANSION: u64 = 1 + 2;

/// The text of a UTF-8 file; a file that is empty or not UTF-8, or too large for this machine's
/// memory, is an error saying so.
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::limits::read_file_that_fits(
        path,
        CHAR_TEXT_EXPANSION,
        "train on a part of it, or tokenize it into nanoGPT's train.bin and val.bin (u16 ids, a third the memory)",
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
/// below `vocab_size`.
pub fn token_bins(dir: &Path, block: usize, vocab_size: usize) -> Result<(TokenWindows, TokenWindows)> {
    let read = |name: &str| -> Result<TokenWindows> {
        let path = dir.join(name);
        let bytes = crate::limits::read_file_that_fits(
            &path,
            TOKEN_BIN_EXPANSION,
            "train on a part of it on this machine, or on a machine with more memory",
        )?;
        token_windows(&bytes, &path.display().to_string(), block, vocab_size)
    };
    Ok((read("train.bin")?, read("val.bin")?.tiled()))
}

/// The windows of `block` tokens over the contents of one of nanoGPT's `.bin` files (named
/// `what` in errors), as [`token_bins`] reads them: little-endian u16 ids, each below
/// `vocab_size`.
pub fn token_windows(bytes: &[u8], what: &str, block: usize, vocab_size: usize) -> Result<TokenWindows> {
    if !bytes.len().is_multiple_of(2) {
        return Err(Error::data(
            what,
            format!(
                "{} bytes is not a whole number of u16 token ids: truncated?",
                bytes.len()
            ),
        ));
    }
    let ids: Vec<u32> = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
        .collect();
    if let Some(at) = ids.iter().position(|&id| id as usize >= vocab_size) {
        return Err(Error::data(
            what,
            format!("token {at} is id {}, past --vocab-size {vocab_size}", ids[at]),
        ));
    }
    TokenWindows::new(ids, block, what)
}
