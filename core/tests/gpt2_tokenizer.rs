//! GPT-2's tokenizer against Python tiktoken's `gpt2` encoding on a committed text
//! (testdata/gpt2-tokenizer, written by scripts/gpt2_tokenizer_fixture.py), and the token cache
//! of a text file: made once, reused while the text stays as it was, made again when the text
//! changes or the cache is damaged.
#![cfg(feature = "gpt2")]

use std::path::Path;

use lockstep_core::data::Dataset;
use lockstep_core::data::gpt2::{Gpt2Tokenizer, MOST_WHITESPACE_RUN, VOCAB_SIZE};
use lockstep_core::data::gpt2_text::{CacheUse, cache_path, gpt2_text};

mod scratch_support;
use scratch_support::Scratch;

fn fixture() -> (String, Vec<u32>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/gpt2-tokenizer");
    let text = std::fs::read_to_string(dir.join("text.txt")).unwrap();
    let ids: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json")).unwrap()).unwrap();
    let ids = ids["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect();
    (text, ids)
}

#[test]
fn ids_equal_python_tiktokens_gpt2_encoding_and_decode_gives_the_text_back() {
    let (text, expected) = fixture();
    assert!(
        text.contains("don't") && text.contains('\r') && text.contains('🚀'),
        "the varied fixture"
    );
    let gpt2 = Gpt2Tokenizer::new();
    let ids = gpt2.encode(&text).unwrap();
    if let Some(at) = ids.iter().zip(&expected).position(|(a, b)| a != b) {
        let near = |v: &[u32]| v[at..(at + 8).min(v.len())].to_vec();
        panic!(
            "id {at} differs: ours {:?}…, tiktoken's {:?}…",
            near(&ids),
            near(&expected)
        );
    }
    assert_eq!(ids.len(), expected.len());
    assert_eq!(gpt2.decode(&ids).unwrap(), text);
    let err = gpt2.decode(&[VOCAB_SIZE as u32]).unwrap_err().to_string();
    assert!(err.contains("50257") && err.contains("past"), "{err}");
}

#[test]
fn a_texts_ids_are_cached_beside_it_reused_and_made_again_when_stale_or_damaged() {
    let dir = Scratch::new("gpt2-cache");
    let path = dir.join("story.txt");
    let story = "Once upon a time, there was a tokenizer. It didn't split words; it merged bytes.\n";
    std::fs::write(&path, story.repeat(10)).unwrap();
    let cache = cache_path(&path);
    assert_eq!(cache, dir.join("story.txt.gpt2.bin"));

    let made = gpt2_text(&path, 8).unwrap();
    assert_eq!(made.cache_use, CacheUse::Made);
    let ids = Gpt2Tokenizer::new().encode(&story.repeat(10)).unwrap();
    assert_eq!(made.tokens, ids.len());
    let split = ids.len() * 9 / 10;
    assert_eq!(made.train.tokens(), ids[..split]);
    assert_eq!(made.val.tokens(), ids[split..]);
    assert_eq!(
        made.val.len(),
        (ids.len() - split - 8 - 1) / 8 + 1,
        "validation windows tiled"
    );

    let again = gpt2_text(&path, 8).unwrap();
    assert_eq!(again.cache_use, CacheUse::Reused);
    assert_eq!(again.train.tokens(), made.train.tokens());

    // A changed text (another length) is tokenized again.
    std::fs::write(&path, story.repeat(12)).unwrap();
    let changed = gpt2_text(&path, 8).unwrap();
    assert!(
        matches!(&changed.cache_use, CacheUse::Remade(why) if why.contains("text changed")),
        "{:?}",
        changed.cache_use
    );
    assert_eq!(
        changed.tokens,
        Gpt2Tokenizer::new().encode(&story.repeat(12)).unwrap().len()
    );
    assert_eq!(gpt2_text(&path, 8).unwrap().cache_use, CacheUse::Reused);

    // A flipped id, a cut-off file and a foreign file are each made again, never used.
    let good = std::fs::read(&cache).unwrap();
    let mut flipped = good.clone();
    flipped[40] ^= 1;
    let damaged = [
        (flipped, "checksum"),
        (good[..good.len() - 1].to_vec(), "truncated"),
        (
            b"not a cache at all, but long enough for a header".to_vec(),
            "not a GPT-2 token cache",
        ),
    ];
    for (bytes, why) in damaged {
        std::fs::write(&cache, bytes).unwrap();
        let remade = gpt2_text(&path, 8).unwrap();
        assert!(
            matches!(&remade.cache_use, CacheUse::Remade(w) if w.contains(why)),
            "{why}: {:?}",
            remade.cache_use
        );
        assert_eq!(std::fs::read(&cache).unwrap(), good, "{why}: the same cache again");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers.len(),
        2,
        "the text and its cache, no temporary files: {leftovers:?}"
    );
}

#[test]
fn a_text_too_short_for_a_block_of_gpt2_tokens_says_so() {
    let dir = Scratch::new("gpt2-short");
    let path = dir.join("short.txt");
    std::fs::write(&path, "Too short.").unwrap();
    let err = gpt2_text(&path, 64).err().unwrap().to_string();
    assert!(err.contains("short.txt") && err.contains("--block-size"), "{err}");
}
#[test]
fn a_whitespace_run_too_long_for_the_pattern_matcher_is_an_error_not_a_panic() {
    // 1,000,000 spaces before a word overflowed the matcher's backtracking stack.
    let gpt2 = Gpt2Tokenizer::new();
    let text = format!("Hello{}world", " ".repeat(1_000_000));
    let err = gpt2.encode(&text).unwrap_err().to_string();
    assert!(
        err.contains("1000000 whitespace characters") && err.contains("byte 5"),
        "{err}"
    );
    let fits = " ".repeat(MOST_WHITESPACE_RUN);
    assert_eq!(gpt2.encode(&format!("{fits}x")).unwrap().len(), MOST_WHITESPACE_RUN);
}
