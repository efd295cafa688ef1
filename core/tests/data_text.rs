//! Text for language models, as nanoGPT reads it: a character vocabulary built from the file,
//! a 90/10 split, windows of `block` tokens with next-token targets; nanoGPT's u16 train.bin /
//! val.bin; and every malformed input (empty, too short, not UTF-8, ids past the vocabulary)
//! a clear error naming the file.

use std::sync::Arc;

use lockstep_core::HostVec;
use lockstep_core::data::text::{CharVocab, char_text, token_bins};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset};

mod scratch_support;
use scratch_support::Scratch;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("text-{name}"))
}

fn ids(field: &HostVec) -> Vec<u32> {
    match field {
        HostVec::U32(v) => v.clone(),
        other => panic!("token ids are u32, got {:?}", other.dtype()),
    }
}

#[test]
fn characters_are_sorted_ids_and_windows_predict_the_next_character() {
    let dir = scratch("chars");
    let path = dir.join("poem.txt");
    // 40 characters: the first 36 train, the last 4 validate.
    let text = "the cat sat on the mat; Zoë's hat! ab";
    let text = format!("{text}{}", "x".repeat(40 - text.chars().count()));
    std::fs::write(&path, &text).unwrap();
    let (vocab, train, val) = char_text(&path, 3).unwrap();
    // nanoGPT: sorted(set(text)); ë sorts after ASCII.
    assert_eq!(vocab, CharVocab::of(&text));
    assert!(
        vocab.chars().starts_with(" !'") && vocab.chars().ends_with("ë"),
        "{}",
        vocab.chars()
    );
    assert_eq!(vocab.decode(&vocab.encode("cat sat").unwrap()).unwrap(), "cat sat");
    assert_eq!((train.tokens().len(), val.tokens().len()), (36, 4));
    assert_eq!((train.len(), val.len()), (33, 1));
    // Window 4 of "the cat…" is "cat" and its targets "at ".
    let batch = train.get_batch(&[4, 0]).unwrap();
    assert_eq!(batch.fields[0].shape.dims(), &[2, 3]);
    let (x, y) = (ids(&batch.fields[0].data), ids(&batch.fields[1].data));
    assert_eq!(vocab.decode(&x).unwrap(), "catthe");
    assert_eq!(vocab.decode(&y).unwrap(), "at he ");
    // Unknown characters and ids are named.
    let err = vocab.encode("cat?").unwrap_err().to_string();
    assert!(err.contains("'?'") && err.contains("at 3"), "{err}");
    assert!(vocab.decode(&[999]).is_err());
}

#[test]
fn validation_windows_tile_the_last_tenth_so_each_token_is_predicted_once() {
    let dir = scratch("tiled");
    let path = dir.join("digits.txt");
    // 100 characters: the last 10 ("0123456789") validate.
    std::fs::write(&path, format!("{}0123456789", "a".repeat(90))).unwrap();
    let (vocab, _, val) = char_text(&path, 3).unwrap();
    assert_eq!(
        val.len(),
        3,
        "windows at 0, 3 and 6; one at 9 would lack its next token"
    );
    let batch = val.get_batch(&[0, 1, 2]).unwrap();
    let (x, y) = (ids(&batch.fields[0].data), ids(&batch.fields[1].data));
    assert_eq!(vocab.decode(&x).unwrap(), "012345678");
    assert_eq!(vocab.decode(&y).unwrap(), "123456789");
    assert!(val.get_batch(&[3]).is_err());
}

#[test]
fn shuffled_windows_are_the_same_for_any_worker_count() {
    let dir = scratch("shuffle");
    let path = dir.join("t.txt");
    std::fs::write(&path, "abcdefghijklmnopqrstuvwxyz".repeat(20)).unwrap();
    let (_, train, _) = char_text(&path, 8).unwrap();
    let train = Arc::new(train);
    let epoch = |workers| -> Vec<Vec<u32>> {
        let config = DataLoaderConfig {
            batch_size: 16,
            num_workers: workers,
            ..Default::default()
        };
        let loader = DataLoader::simple(train.clone(), true, 7, config).unwrap();
        loader.iter(1).map(|b| ids(&b.unwrap().fields[0].data)).collect()
    };
    let reference = epoch(0);
    assert_eq!(reference.len(), (468 - 8usize).div_ceil(16));
    assert_eq!(epoch(3), reference);
}

#[test]
fn nanogpts_token_bins_read_as_u16_ids_below_the_vocabulary() {
    let dir = scratch("bins");
    let write = |name: &str, ids: &[u16]| {
        let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    write("train.bin", &[50256, 1, 2, 3, 4, 5]);
    write("val.bin", &[7, 8, 9]);
    let (train, val) = token_bins(&dir, 2, 50304).unwrap();
    assert_eq!(train.tokens(), [50256, 1, 2, 3, 4, 5]);
    assert_eq!((train.len(), val.len()), (4, 1));
    let err = token_bins(&dir, 2, 50000).err().unwrap().to_string();
    assert!(
        err.contains("train.bin") && err.contains("token 0 is id 50256") && err.contains("--vocab-size 50000"),
        "{err}"
    );
    std::fs::write(dir.join("val.bin"), [1u8, 0, 2]).unwrap();
    let err = token_bins(&dir, 2, 50304).err().unwrap().to_string();
    assert!(err.contains("val.bin") && err.contains("3 bytes"), "{err}");
}

#[test]
fn empty_short_and_non_utf8_files_are_errors_naming_the_file() {
    let dir = scratch("bad");
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        char_text(&path, 8).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let err = file("empty.txt", b"");
    assert!(err.contains("empty.txt") && err.contains("empty"), "{err}");
    let err = file("short.txt", b"hello world, but short");
    assert!(err.contains("short.txt") && err.contains("--block-size"), "{err}");
    let err = file("latin1.txt", b"caf\xe9 au lait and more text than a block");
    assert!(
        err.contains("latin1.txt") && err.contains("not UTF-8") && err.contains("offset 3"),
        "{err}"
    );
}
