//! Files of little-endian u16 token ids (nanoGPT's train.bin / val.bin, a text's GPT-2 token
//! cache), memory-mapped instead of read whole: a run on billions of tokens keeps only the
//! pages its windows touch, and the operating system shares them among processes.

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// A run of u16 token ids in a memory-mapped file: all of its ids after a header, or a part.
#[derive(Clone)]
pub struct MappedTokens {
    map: Arc<Mmap>,
    /// Where the ids start in the map, in bytes.
    start: usize,
    /// How many ids there are.
    len: usize,
}

impl MappedTokens {
    /// The ids of the file at `path` after its first `header` bytes (named `what` in errors):
    /// a body of odd length, or an id at or past `vocab_size`, is an error saying which.
    pub fn open(path: &Path, header: usize, vocab_size: usize, what: &str) -> Result<MappedTokens> {
        let map = map_file(path, what)?;
        let Some(body) = map.get(header..) else {
            return Err(Error::data(
                what,
                format!("{} bytes: shorter than its {header}-byte header", map.len()),
            ));
        };
        check_ids(body, vocab_size, what)?;
        Ok(MappedTokens {
            len: body.len() / 2,
            start: header,
            map: Arc::new(map),
        })
    }
    /// The ids in `range` (in ids from this run's first), sharing the map.
    pub fn slice(&self, range: Range<usize>) -> MappedTokens {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "{range:?} past {} ids",
            self.len
        );
        MappedTokens {
            map: self.map.clone(),
            start: self.start + 2 * range.start,
            len: range.len(),
        }
    }
    /// The bytes before this run's first id: for what `open` returns, the file's header.
    pub fn header(&self) -> &[u8] {
        &self.map[..self.start]
    }
    /// The ids' bytes, little-endian u16 each.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + 2 * self.len]
    }
    /// How many ids there are.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when there are no ids.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Appends the ids in `range` to `out`, widened to u32.
    pub fn extend(&self, range: Range<usize>, out: &mut Vec<u32>) {
        let bytes = &self.map[self.start + 2 * range.start..self.start + 2 * range.end];
        out.extend(bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32));
    }
}

/// The bytes of the file at `path`, mapped read-only (host memory is the CPU backend's, and
/// with it the one `unsafe` a mapping needs).
fn map_file(path: &Path, what: &str) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| Error::data(what, format!("cannot open it: {e}")))?;
    crate::backend::cpu::mapped_file::map_read_only(&file)
        .map_err(|e| Error::data(what, format!("cannot memory-map it: {e}")))
}

/// Checks that `bytes` are whole u16 ids, each below `vocab_size`.
pub(crate) fn check_ids(bytes: &[u8], vocab_size: usize, what: &str) -> Result<()> {
    if !bytes.len().is_multiple_of(2) {
        return Err(Error::data(
            what,
            format!(
                "{} bytes is not a whole number of u16 token ids: truncated?",
                bytes.len()
            ),
        ));
    }
    let past = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .enumerate()
        .find(|&(_, id)| id as usize >= vocab_size);
    match past {
        Some((at, id)) => Err(Error::data(
            what,
            format!("token {at} is id {id}, past --vocab-size {vocab_size}"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `bytes` in a folder of its own, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn file(name: &str, bytes: &[u8]) -> (Scratch, std::path::PathBuf) {
            let dir = std::env::temp_dir().join(format!("lockstep-token-file-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            (Scratch(dir), path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn open_err(name: &str, bytes: &[u8], header: usize) -> String {
        let (_dir, path) = Scratch::file(name, bytes);
        MappedTokens::open(&path, header, 10, name).err().unwrap().to_string()
    }

    #[test]
    fn ids_after_the_header_are_read_through_the_map_and_slices_share_it() {
        let ids: [u16; 5] = [3, 50256, 0, 7, 9];
        let mut bytes = b"HEAD".to_vec();
        bytes.extend(ids.iter().flat_map(|i| i.to_le_bytes()));
        let (_dir, path) = Scratch::file("ok.bin", &bytes);
        let tokens = MappedTokens::open(&path, 4, 50257, "ok.bin").unwrap();
        assert_eq!(tokens.header(), b"HEAD");
        assert_eq!(tokens.len(), 5);
        let (mut all, mut part) = (Vec::new(), Vec::new());
        tokens.extend(0..5, &mut all);
        tokens.slice(1..4).extend(1..3, &mut part);
        assert_eq!(all, [3, 50256, 0, 7, 9]);
        assert_eq!(part, [0, 7]);
    }

    #[test]
    fn an_odd_length_an_id_past_the_vocabulary_and_a_short_header_are_errors_naming_the_file() {
        let err = open_err("odd.bin", &[1, 0, 2], 0);
        assert!(
            err.contains("odd.bin") && err.contains("3 bytes") && err.contains("truncated"),
            "{err}"
        );
        let err = open_err("past.bin", &[1, 0, 12, 0], 0);
        assert!(
            err.contains("token 1 is id 12") && err.contains("--vocab-size 10"),
            "{err}"
        );
        let err = open_err("short.bin", &[1, 0], 4);
        assert!(err.contains("short.bin") && err.contains("4-byte header"), "{err}");
        let (_dir, path) = Scratch::file("empty.bin", &[]);
        assert!(MappedTokens::open(&path, 0, 10, "empty.bin").unwrap().is_empty());
        let err = MappedTokens::open(&path.with_extension("none"), 0, 10, "missing.bin")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("missing.bin") && err.contains("cannot open"), "{err}");
    }
}
