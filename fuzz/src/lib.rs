//! The fuzz targets' harnesses, one function per target (fuzz_targets/<name>.rs calls it on
//! libFuzzer's input, and core/tests/fuzz_regressions.rs on every saved input of
//! fuzz/regressions/<name>/, so both read an input the same way); the bound on allocations;
//! the small training run a fuzzed checkpoint is resumed into. A harness asserts nothing about
//! what the readers return, Ok or Err: only that they return (no panic, hang or allocation past
//! the bound).

use std::alloc::System;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use cap::Cap;
use lockstep_core::nn::{BatchNorm1d, Dropout, Linear, Module, ModuleExt};
use lockstep_core::optim::{Adam, AdamConfig, StepLR};
use lockstep_core::train::{EarlyStopping, ModelCheckpoint, Monitor, Progress, Trainer, TrainerConfig, TrainingSetup};
use lockstep_core::{Device, Generator, Result, Tensor};

/// The most heap the process may hold at once. The targets' inputs are at most tens of KiB
/// (inflated, at most tens of MiB): a reader that asks for more believed a length field instead
/// of counting the bytes that are there. The allocation fails, Rust aborts the process ("memory
/// allocation of N bytes failed"), and libFuzzer reports a crash. (libFuzzer's own
/// `-malloc_limit_mb` needs a sanitizer's allocator hooks, which a stable build has not.)
pub const HEAP_LIMIT: usize = 256 << 20;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, HEAP_LIMIT);

/// A model with a parameter of each kind a checkpoint holds: weights, a bias, BatchNorm's running
/// statistics and step count (an i64 buffer), and a dropout stream whose state the trainer keeps.
#[derive(Module)]
pub struct Tiny {
    fc: Linear,
    norm: BatchNorm1d,
    drop: Dropout,
}

impl Tiny {
    /// Linear 4 -> 3, BatchNorm1d(3), dropout 0.1.
    pub fn new() -> Result<Tiny> {
        let (device, init) = (Device::cpu(), Generator::new(0));
        Ok(Tiny {
            fc: Linear::new(4, 3, true, &device, &init)?,
            norm: BatchNorm1d::new(3, &device)?,
            drop: Dropout::new(0.1, Arc::new(Generator::new(1)))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.drop.forward(&self.norm.forward(&self.fc.forward(x)?)?)
    }
}

/// A trainer of two epochs, logging every step, with the callbacks whose state a checkpoint
/// carries (`ModelCheckpoint` saving into `checkpoints`), and the setup of `Tiny` trained by Adam
/// on a step schedule, with one random stream outside the model.
pub fn tiny_run(checkpoints: &Path) -> Result<(Trainer, TrainingSetup)> {
    let model = Tiny::new()?;
    let optimizer = Adam::new(model.parameters(), AdamConfig::adam().lr(1e-2))?;
    let setup = TrainingSetup::new(model, optimizer)
        .schedule(StepLR::new(2, 0.5)?)
        .generator(Arc::new(Generator::new(2)))
        .name("tiny")
        .hparam("hidden", 3);
    let mut trainer = Trainer::new(TrainerConfig {
        max_epochs: 2,
        log_every_n_steps: 1,
        progress: Progress::Off,
        ..TrainerConfig::default()
    })?;
    trainer.add_callback(EarlyStopping::new(Monitor::min("train_loss"), 3, 0.0));
    trainer.add_callback(ModelCheckpoint::new(checkpoints));
    Ok((trainer, setup))
}

/// `bytes` gzipped, as a downloaded data file is.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

/// Runs the harness of `target` (a file name in fuzz_targets/, without `.rs`) on `data`; false
/// for a target there is no harness of.
pub fn run(target: &str, data: &[u8]) -> bool {
    match target {
        "mnist_idx" => mnist_idx(data),
        "checkpoint" => checkpoint(data),
        "metrics_jsonl" => metrics_jsonl(data),
        "cifar" => cifar(data),
        "text" => text(data),
        "rendezvous_wire" => rendezvous_wire(data),
        _ => return false,
    }
    true
}

/// MNIST's IDX reader (`Mnist::from_bytes`, what `Mnist::load` reads files with), raw and
/// gzipped.
///
/// Input: a mode byte, the image file's length (u16, little-endian), the image file, then the
/// label file. Mode bit 0 gzips the image file and bit 1 the label file before the reader sees
/// them, so the fuzzer shapes what is inside a valid gzip stream; unset, the bytes go as they are
/// (a raw IDX file, or, starting with the gzip magic, a gzip stream of the fuzzer's own).
pub fn mnist_idx(data: &[u8]) {
    use lockstep_core::data::Dataset;
    use lockstep_core::data::mnist::Mnist;

    let Some((&[mode, lo, hi], rest)) = data.split_first_chunk::<3>() else {
        return;
    };
    let (images, labels) = rest.split_at(usize::from(u16::from_le_bytes([lo, hi])).min(rest.len()));
    let file = |bytes: &[u8], gzipped: bool| if gzipped { gzip(bytes) } else { bytes.to_vec() };
    let Ok(mnist) = Mnist::from_bytes(
        ("images", file(images, mode & 1 != 0)),
        ("labels", file(labels, mode & 2 != 0)),
    ) else {
        return;
    };
    // What was accepted is used as training uses it: batches, the last sample, one past it.
    let n = mnist.len();
    let _ = mnist.get_batch(&(0..n.min(16)).collect::<Vec<_>>());
    let _ = mnist.get(n.saturating_sub(1));
    let _ = mnist.get(n);
}

/// Checkpoints and weight files: the safetensors header and tensors (`checkpoint::parse_tensors`,
/// what `load_tensors` reads files with), the header alone (`checkpoint::read_metadata`), loading
/// the tensors into a small model strictly and not (`nn::load_weights`, behind `Module::load`),
/// and resuming a training run from them (`Trainer::resume_from`, behind `Trainer::resume`): the
/// trainer state, optimizer scalars and callback states are JSON in the file's metadata, and the
/// shapes need not fit the model.
pub fn checkpoint(data: &[u8]) {
    use lockstep_core::nn::load_weights;
    use lockstep_core::train::checkpoint::{parse_tensors, read_metadata};

    let _ = read_metadata(data, "fuzz.safetensors");
    let Ok(file) = parse_tensors(data, "fuzz.safetensors") else {
        return;
    };
    let model = Tiny::new().expect("the tiny model");
    let _ = load_weights(&model, &file, true);
    let _ = load_weights(&model, &file, false);
    // Resuming reads the callbacks' state and writes nothing: the directory is never made.
    let never_written = std::env::temp_dir().join("lockstep-fuzz-never-written");
    let (mut trainer, mut setup) = tiny_run(&never_written).expect("the tiny run");
    let _ = trainer.resume_from(&mut setup, &file, "fuzz.safetensors");
}

/// The metrics log the dashboard reads and follows (`train::parse_metrics_log`, and
/// `parse_metrics_line` for each line of a log that is still growing), from bytes that need not
/// be UTF-8 (the dashboard's follower decodes them lossily).
pub fn metrics_jsonl(data: &[u8]) {
    use lockstep_core::train::{parse_metrics_line, parse_metrics_log};

    let text = String::from_utf8_lossy(data);
    let _ = parse_metrics_log(&text);
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let _ = parse_metrics_line(line.trim_end(), i + 1, !line.ends_with('\n'));
    }
}

/// CIFAR-10 and CIFAR-100 binary records (`Cifar::from_batches`, what `Cifar::load` reads a
/// directory's batch files with) and the published archive (`Cifar::from_archive`, behind
/// `Cifar::load` on a `.tar.gz`).
///
/// Input: a mode byte, then the data. Mode bit 0 picks CIFAR-100 over CIFAR-10; bits 1-2 say
/// what the data is: 0 the records of two batch files (the first `mode >> 3` records long), 1 a
/// tar stream that the harness gzips (the test split asked for), 2 the `.tar.gz` itself (the
/// training split), 3 a tar stream again, both splits asked for.
pub fn cifar(data: &[u8]) {
    use lockstep_core::data::ImageSource;
    use lockstep_core::data::cifar::{Cifar, Kind, PIXELS, Split};

    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let kind = if mode & 1 == 0 { Kind::Cifar10 } else { Kind::Cifar100 };
    let loaded = match (mode >> 1) & 3 {
        0 => {
            let cut = (usize::from(mode >> 3) * kind.record_bytes()).min(data.len());
            let (a, b) = data.split_at(cut);
            let files = [("a.bin".to_string(), a.to_vec()), ("b.bin".to_string(), b.to_vec())];
            Cifar::from_batches(kind, &files[..if b.is_empty() { 1 } else { 2 }]).map(|c| vec![c])
        }
        1 => Cifar::from_archive(&gzip(data)[..], "fuzz.tar.gz", kind, &[Split::Test]),
        2 => Cifar::from_archive(data, "fuzz.tar.gz", kind, &[Split::Train]),
        _ => Cifar::from_archive(&gzip(data)[..], "fuzz.tar.gz", kind, &[Split::Train, Split::Test]),
    };
    // What was accepted is read as training reads it: every image, and one past the end.
    let mut image = vec![0u8; PIXELS];
    for split in loaded.iter().flatten() {
        for i in 0..=split.len() {
            let _ = split.read(i, &mut image);
        }
    }
}

/// The launcher's rendezvous protocol (`distributed::rendezvous::wire`): the same bytes read as a
/// request (what rank 0's server reads from any connection, before the token is checked) and as
/// a reply (what a rank reads from rank 0). What parses is written back and must read back the
/// same, so a frame the reader accepts is one the writer makes.
pub fn rendezvous_wire(data: &[u8]) {
    use lockstep_core::distributed::rendezvous::wire::{read_reply, read_request, write_reply, write_request};

    if let Ok(request) = read_request(&mut &data[..]) {
        let mut again = Vec::new();
        write_request(&mut again, &request).expect("writing to memory");
        assert_eq!(
            read_request(&mut &again[..]).expect("a written request reads back"),
            request
        );
    }
    if let Ok(reply) = read_reply(&mut &data[..]) {
        let mut again = Vec::new();
        write_reply(&mut again, &reply).expect("writing to memory");
        assert_eq!(read_reply(&mut &again[..]).expect("a written reply reads back"), reply);
    }
}

/// Text for language models: a text file's bytes (`data::text::parse_text`, what `read_text`
/// reads files with, then `char_windows`, behind `char_text`), and nanoGPT's pre-tokenized
/// `.bin` files (`token_windows`, behind `token_bins`).
///
/// Input: a byte choosing the block size (its low 4 bits, plus 1) and the vocabulary size of the
/// `.bin` reading (its high 4 bits, times 4096, plus 1), then the file.
pub fn text(data: &[u8]) {
    use lockstep_core::data::Dataset;
    use lockstep_core::data::text::{char_windows, parse_text, token_windows};

    let Some((&sizes, data)) = data.split_first() else {
        return;
    };
    let block = usize::from(sizes & 15) + 1;
    let vocab_size = usize::from(sizes >> 4) * 4096 + 1;
    if let Ok(windows) = token_windows(data, "fuzz.bin", block, vocab_size) {
        let _ = windows.get(windows.len().saturating_sub(1));
    }
    let Ok(text) = parse_text(data.to_vec(), "fuzz.txt") else {
        return;
    };
    if let Ok((vocab, train, val)) = char_windows(&text, "fuzz.txt", block) {
        // Used as training and sampling use them: windows, and ids back to text.
        let _ = vocab.encode(&text).and_then(|ids| vocab.decode(&ids));
        let _ = train.get(0);
        let _ = val.get(val.len().saturating_sub(1));
    }
}
