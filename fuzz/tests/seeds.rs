//! Writes the seed corpora under fuzz/corpus/<target>/ with Lockstep's own writers: small valid
//! inputs (each well under 64 KiB) that the fuzzers start from. The seeds are committed; run this
//! again only when a format changes:
//!
//!     cargo test --manifest-path fuzz/Cargo.toml --test seeds -- --ignored

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lockstep_core::HostVec;
use lockstep_core::data::cifar::{Kind, PIXELS};
use lockstep_core::data::{DataLoader, DataLoaderConfig, HostTensor, TensorDataset};
use lockstep_core::nn::ModuleExt;
use lockstep_core::train::JsonlWriter;
use lockstep_core::train::checkpoint::save_tensors;
use lockstep_fuzz::{gzip, tiny_run};

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn seed(target: &str, name: &str, bytes: &[u8]) {
    assert!(bytes.len() < 64 << 10, "{target}/{name}: {} bytes", bytes.len());
    // The `.seed` suffix keeps seeds apart from what fuzzing adds (see fuzz/.gitignore).
    std::fs::write(corpus(target).join(format!("{name}.seed")), bytes).unwrap();
}

/// An IDX file of unsigned bytes: magic, big-endian dimensions, data.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, dims.len() as u8];
    dims.iter().for_each(|d| out.extend(d.to_be_bytes()));
    out.extend(data);
    out
}

/// The mnist_idx target's input: mode, image file length, image file, label file.
fn mnist_input(mode: u8, images: &[u8], labels: &[u8]) -> Vec<u8> {
    let mut out = vec![mode];
    out.extend(u16::try_from(images.len()).unwrap().to_le_bytes());
    out.extend(images);
    out.extend(labels);
    out
}

#[test]
#[ignore = "writes the committed seed corpora"]
fn write_seeds() {
    mnist();
    cifar();
    text();
    checkpoint_and_metrics();
    rendezvous();
}

/// A rank's check-in and a `Get`, and rank 0's answers, as on the wire.
fn rendezvous() {
    use lockstep_core::distributed::rendezvous::wire::{Op, Reply, Request, write_reply, write_request};

    let request = |op, key: &str, value: &[u8], number| {
        let mut frame = Vec::new();
        let request = Request {
            token: "0123456789abcdef0123456789abcdef".into(),
            op,
            rank: 1,
            key: key.into(),
            value: value.to_vec(),
            number,
        };
        write_request(&mut frame, &request).unwrap();
        frame
    };
    seed("rendezvous_wire", "hello", &request(Op::Hello, "", &[], 2));
    seed("rendezvous_wire", "set", &request(Op::Set, "nccl-id", &[7; 128], 0));
    seed(
        "rendezvous_wire",
        "barrier",
        &request(Op::Barrier, "start", &[], 300_000),
    );
    let reply = |reply: Reply| {
        let mut frame = Vec::new();
        write_reply(&mut frame, &reply).unwrap();
        frame
    };
    seed("rendezvous_wire", "ok", &reply(Reply::Ok(vec![7; 128])));
    let timed_out = Reply::TimedOut {
        missing: vec![1, 3],
        notes: "a process from 10.0.0.2:5000 presented another job's token".into(),
    };
    seed("rendezvous_wire", "timed-out", &reply(timed_out));
}

fn mnist() {
    // Three 28x28 digits.
    let pixels: Vec<u8> = (0..3 * 28 * 28).map(|i| ((i * 7) % 256) as u8).collect();
    let (images, labels) = (idx(&[3, 28, 28], &pixels), idx(&[3], &[7, 2, 1]));
    seed("mnist_idx", "raw", &mnist_input(0, &images, &labels));
    seed("mnist_idx", "gz-by-target", &mnist_input(3, &images, &labels));
    seed("mnist_idx", "gz-files", &mnist_input(0, &gzip(&images), &gzip(&labels)));
}

/// `n` records of `kind`, label bytes then patterned pixels.
fn records(kind: Kind, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for r in 0..n {
        if kind == Kind::Cifar100 {
            out.push(r as u8 % 20);
        }
        out.push((r * 3 % kind.classes()) as u8);
        out.extend((0..PIXELS).map(|i| ((i / 32 + r * 40) % 256) as u8));
    }
    out
}

/// A tar stream holding `files` in the folder the published archive unpacks into.
fn tar_of(kind: Kind, files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, format!("{}/{name}", kind.folder()), &bytes[..])
            .unwrap();
    }
    tar.into_inner().unwrap()
}

fn cifar() {
    let with_mode = |mode: u8, data: &[u8]| [&[mode][..], data].concat();
    // Mode 0 (CIFAR-10 records in two files, the first one record long), and CIFAR-100's (mode 1).
    seed(
        "cifar",
        "cifar10-records",
        &with_mode(1 << 3, &records(Kind::Cifar10, 2)),
    );
    seed(
        "cifar",
        "cifar100-records",
        &with_mode(1 | 1 << 3, &records(Kind::Cifar100, 2)),
    );
    // Mode 1: a tar stream with CIFAR-10's test batch, gzipped by the target.
    let test = tar_of(Kind::Cifar10, &[("test_batch.bin", records(Kind::Cifar10, 2))]);
    seed("cifar", "cifar10-test-tar", &with_mode(1 << 1, &test));
    // Mode 2: the published .tar.gz layout of CIFAR-10's training batches.
    let train: Vec<(&str, Vec<u8>)> = Kind::Cifar10
        .files(lockstep_core::data::cifar::Split::Train)
        .iter()
        .map(|name| (*name, records(Kind::Cifar10, 1)))
        .collect();
    seed(
        "cifar",
        "cifar10-train-tar-gz",
        &with_mode(2 << 1, &gzip(&tar_of(Kind::Cifar10, &train))),
    );
    // Mode 3 with CIFAR-100: both splits from one tar stream.
    let both = tar_of(
        Kind::Cifar100,
        &[
            ("train.bin", records(Kind::Cifar100, 1)),
            ("test.bin", records(Kind::Cifar100, 1)),
        ],
    );
    seed("cifar", "cifar100-both-tar", &with_mode(1 | 3 << 1, &both));
}

fn text() {
    // Block 8 (low bits 7), vocabulary 4097 (high bits 1).
    let text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n";
    seed("text", "shakespeare", &[&[0x17][..], text.as_bytes()].concat());
    seed(
        "text",
        "unicode",
        &[&[0x03][..], "naïve café — 東京 🚀\n".as_bytes()].concat(),
    );
    let ids: Vec<u8> = [15496u16, 11, 995, 0, 50256, 464, 2068, 7586, 21831, 13]
        .iter()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    // Block 4, vocabulary 15 * 4096 + 1 = 61441 (all of GPT-2's ids fit).
    seed("text", "gpt2-ids", &[&[0xf3][..], &ids].concat());
}

/// A real run of the tiny model: its checkpoint, its weights alone, and its metrics log.
fn checkpoint_and_metrics() {
    let dir = std::env::temp_dir().join(format!("lockstep-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x: Vec<f32> = (0..8 * 4).map(|i| (i as f32 * 0.37).sin()).collect();
    let y: Vec<u32> = (0..8).map(|i| i % 3).collect();
    let data = TensorDataset::new(vec![
        HostTensor::new(HostVec::F32(x), [8, 4]).unwrap(),
        HostTensor::new(HostVec::U32(y), [8]).unwrap(),
    ])
    .unwrap();
    let config = DataLoaderConfig {
        batch_size: 4,
        ..Default::default()
    };
    let loader = DataLoader::simple(Arc::new(data), true, 0, config).unwrap();

    let (mut trainer, mut setup) = tiny_run(&dir).unwrap();
    let log = dir.join("metrics.jsonl");
    trainer.add_listener(JsonlWriter::create(&log).unwrap());
    trainer.fit(&mut setup, &loader, Some(&loader)).unwrap();

    let ckpt = dir.join("last.safetensors");
    trainer.save_checkpoint(&setup, &ckpt).unwrap();
    seed("checkpoint", "checkpoint", &std::fs::read(&ckpt).unwrap());
    let weights = dir.join("weights.safetensors");
    save_tensors(&weights, &setup.model.state_dict(), Default::default()).unwrap();
    seed("checkpoint", "weights", &std::fs::read(&weights).unwrap());

    let log = std::fs::read_to_string(&log).unwrap();
    seed("metrics_jsonl", "run", log.as_bytes());
    // A log cut in the middle of a line (a run still writing it), and one from a newer version.
    let cut = log.len() * 2 / 3;
    let cut = (cut..log.len()).find(|&i| log.is_char_boundary(i)).unwrap();
    seed("metrics_jsonl", "still-writing", &log.as_bytes()[..cut]);
    let newer = format!("{}{{\"t\":9.5,\"event\":\"profile\",\"kernel\":\"gemm\"}}\n", &log);
    seed("metrics_jsonl", "newer-event", newer.as_bytes());
    std::fs::remove_dir_all(&dir).unwrap();
}
