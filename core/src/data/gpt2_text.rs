//! A UTF-8 text file as GPT-2 token ids, tokenized once into a cache beside it
//! (`FILE.gpt2.bin`) and memory-mapped from there on, split 90/10 into training and validation
//! tokens as the character path splits its characters.
//!
//! The cache is a 32-byte header, then the ids as nanoGPT's train.bin holds them (little-endian
//! u16). The header names the text it was made from (its length and modification time) and
//! checksums the ids: a cache of another version of the text, or one damaged since, is made
//! again, never used. It is written under a temporary name and renamed into place, so a run
//! stopped while tokenizing, or two processes tokenizing at once, never leave half a cache.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::gpt2::{Gpt2Tokenizer, VOCAB_SIZE};
use super::text::{TokenWindows, read_text};
use super::token_file::MappedTokens;
use crate::error::{Error, Result};

/// What the cache's name adds to the text's.
pub const CACHE_SUFFIX: &str = ".gpt2.bin";
/// The cache's first bytes: what it is, and the layout's version.
const MAGIC: &[u8; 8] = b"LSGPT2\0\x01";
/// The magic, the text's length and modification time (u64 each), the ids' CRC-32 and 4 bytes
/// kept zero.
const HEADER: usize = 32;
const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// A text's GPT-2 windows and how its cache served them.
pub struct Gpt2Text {
    /// Windows over the first 90% of the ids.
    pub train: TokenWindows,
    /// Windows tiling the last 10%.
    pub val: TokenWindows,
    /// How many ids the text is.
    pub tokens: usize,
    /// Where the ids are cached.
    pub cache: PathBuf,
    /// Whether this run made the cache, and why.
    pub cache_use: CacheUse,
}

/// How a run came by a text's ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheUse {
    /// The cache matched the text: nothing was tokenized.
    Reused,
    /// There was no cache: the text was tokenized.
    Made,
    /// The cache did not match the text or was damaged (the reason): the text was tokenized again.
    Remade(String),
}

/// Where the ids of the text at `text` are cached: beside it, `FILE` + [`CACHE_SUFFIX`].
pub fn cache_path(text: &Path) -> PathBuf {
    let mut name = text.file_name().unwrap_or_default().to_os_string();
    name.push(CACHE_SUFFIX);
    text.with_file_name(name)
}

/// The text at `path` as windows of `block` GPT-2 tokens, from its cache when that matches the
/// text, else tokenized and cached first.
pub fn gpt2_text(path: &Path, block: usize) -> Result<Gpt2Text> {
    let what = path.display().to_string();
    let key = TextKey::of(path, &what)?;
    let cache = cache_path(path);
    let (tokens, cache_use) = match cached_ids(&cache, key) {
        Ok(Some(tokens)) => (tokens, CacheUse::Reused),
        Ok(None) => (make_cache(path, &cache, key)?, CacheUse::Made),
        Err(why) => (make_cache(path, &cache, key)?, CacheUse::Remade(why)),
    };
    let split = tokens.len() * 9 / 10;
    let train = TokenWindows::mapped(
        tokens.slice(0..split),
        block,
        &format!("{what} (GPT-2 tokens, its first 90%, for training)"),
    )?;
    let val = TokenWindows::mapped(
        tokens.slice(split..tokens.len()),
        block,
        &format!("{what} (GPT-2 tokens, its last 10%, for validation)"),
    )?
    .tiled();
    Ok(Gpt2Text {
        train,
        val,
        tokens: tokens.len(),
        cache,
        cache_use,
    })
}

/// What identifies a version of the text: its length and modification time.
#[derive(Clone, Copy, PartialEq, Eq)]
struct TextKey {
    bytes: u64,
    modified_ns: u64,
}

impl TextKey {
    fn of(path: &Path, what: &str) -> Result<TextKey> {
        let meta = std::fs::metadata(path).map_err(|e| Error::data(what, format!("cannot read it: {e}")))?;
        let modified = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        Ok(TextKey {
            bytes: meta.len(),
            modified_ns: modified.map_or(0, |d| d.as_nanos() as u64),
        })
    }
}

/// The header of a cache of the text `key` names, whose ids are `body`.
fn header(key: TextKey, body: &[u8]) -> [u8; HEADER] {
    let mut out = [0; HEADER];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&key.bytes.to_le_bytes());
    out[16..24].copy_from_slice(&key.modified_ns.to_le_bytes());
    out[24..28].copy_from_slice(&CRC32.checksum(body).to_le_bytes());
    out
}

/// The cached ids when `cache` holds those of the text `key` names; None when there is no
/// cache; the reason when it is of another text or damaged.
fn cached_ids(cache: &Path, key: TextKey) -> std::result::Result<Option<MappedTokens>, String> {
    if !cache.exists() {
        return Ok(None);
    }
    let tokens =
        MappedTokens::open(cache, HEADER, VOCAB_SIZE, &cache.display().to_string()).map_err(|e| e.to_string())?;
    let found = tokens.header();
    if found.get(..8) != Some(MAGIC.as_slice()) {
        return Err("it is not a GPT-2 token cache of this version".into());
    }
    if found != header(key, tokens.bytes()) {
        let other_text = found[8..24] != header(key, &[])[8..24];
        return Err(if other_text {
            "the text changed since it was tokenized".into()
        } else {
            "its ids do not match their checksum".into()
        });
    }
    Ok(Some(tokens))
}

/// Tokenizes the text at `path` into `cache` (written whole under a temporary name, then
/// renamed) and maps it.
fn make_cache(path: &Path, cache: &Path, key: TextKey) -> Result<MappedTokens> {
    let text = read_text(path)?;
    let ids = Gpt2Tokenizer::new()
        .encode(&text)
        .map_err(|e| Error::data(path.display().to_string(), e.to_string()))?;
    drop(text);
    // Every id is below 50257, so it fits in a u16.
    let body: Vec<u8> = ids.iter().flat_map(|&id| (id as u16).to_le_bytes()).collect();
    drop(ids);
    let mut temporary = cache.as_os_str().to_os_string();
    temporary.push(format!(".tmp-{}", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let shown = cache.display().to_string();
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&header(key, &body))?;
        file.write_all(&body)?;
        file.sync_all()?;
        std::fs::rename(&temporary, cache)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&temporary);
        Error::data(
            &shown,
            format!(
                "cannot write the GPT-2 token cache of {}: {e}; make its folder writable, or copy the text where it is",
                path.display()
            ),
        )
    })?;
    MappedTokens::open(cache, HEADER, VOCAB_SIZE, &shown)
}
