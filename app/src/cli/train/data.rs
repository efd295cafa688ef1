//! The run's data: generated digit reversal for seq2seq, else `--dataset` (MNIST, CIFAR-10,
//! CIFAR-100, a folder of images or text) from `--data` or its per-user home, MNIST fetched
//! there on first use. A missing or unreachable data set is a two-line error: where it looked
//! and which files, then the ways out.

use std::path::Path;
use std::sync::Arc;

use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::cifar::{self, Cifar};
use lockstep_core::data::gpt2;
use lockstep_core::data::gpt2_text::{self, CacheUse};
use lockstep_core::data::image_folder::{self, IMAGENET_MEAN_STD, ImageFolder};
use lockstep_core::data::mnist::{self, Mnist, Split};
use lockstep_core::data::reversal::Reversal;
use lockstep_core::data::text::{self, CharVocab};
use lockstep_core::data::{Dataset, Head, ImageClassification, ImageSource};
use lockstep_core::models::Input;

use super::download;
use lockstep_flags::train::{Args, DatasetKind, TokenizerKind};

/// Sequences per epoch and in the test set of `--model seq2seq` (other seeds, other samples).
const REVERSAL_TRAIN: usize = 100_000;
const REVERSAL_TEST: usize = 2_000;

/// The (train, test) sets of the run, the test set cut to `--test-samples`.
pub fn load(args: &Args) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let (train, test) = if args.model == "seq2seq" {
        let train: Arc<dyn Dataset> = Arc::new(Reversal::new(REVERSAL_TRAIN, 1));
        (train, Arc::new(Reversal::new(REVERSAL_TEST, 2)) as Arc<dyn Dataset>)
    } else {
        match args.dataset {
            DatasetKind::Mnist => load_mnist(args)?,
            DatasetKind::Cifar10 => load_cifar(args, cifar::Kind::Cifar10)?,
            DatasetKind::Cifar100 => load_cifar(args, cifar::Kind::Cifar100)?,
            DatasetKind::Folder => load_folder(args)?,
            DatasetKind::Text => load_text(args)?,
        }
    };
    let test = match args.test_samples {
        Some(n) => Arc::new(Head::new(test, n)),
        None => test,
    };
    Ok((train, test))
}

/// The images and classes `--dataset` gives a model.
pub fn input(args: &Args) -> anyhow::Result<Input> {
    let cifar = |kind: cifar::Kind| Input {
        image: [3, 32, 32],
        classes: kind.classes(),
    };
    Ok(match args.dataset {
        DatasetKind::Cifar10 => cifar(cifar::Kind::Cifar10),
        DatasetKind::Cifar100 => cifar(cifar::Kind::Cifar100),
        DatasetKind::Mnist => Input::MNIST,
        DatasetKind::Text => anyhow::bail!("--dataset text feeds the language models, which take no images"),
        DatasetKind::Folder => {
            let (train, _) = folder_roots(args)?;
            Input {
                image: [3, args.image_size, args.image_size],
                classes: image_folder::class_names(&train)?.len(),
            }
        }
    })
}

/// What the tokens of `--dataset text` are: a file's characters, GPT-2's BPE ids, or ids
/// below --vocab-size of a tokenizer the run does not name.
pub enum TextVocabulary {
    Chars(CharVocab),
    Gpt2,
    Ids(usize),
}

impl TextVocabulary {
    pub fn size(&self) -> usize {
        match self {
            TextVocabulary::Chars(chars) => chars.len(),
            TextVocabulary::Gpt2 => gpt2::VOCAB_SIZE,
            TextVocabulary::Ids(size) => *size,
        }
    }
}

/// Where `--dataset text` reads: a UTF-8 file, or a directory of train.bin and val.bin.
fn text_source(args: &Args) -> anyhow::Result<(std::path::PathBuf, bool)> {
    let Some(path) = args.data.clone() else {
        anyhow::bail!(
            "--dataset text needs --data FILE (a UTF-8 text) or --data DIR (nanoGPT's train.bin and val.bin)"
        );
    };
    if path.is_dir() {
        anyhow::ensure!(
            path.join("train.bin").is_file() && path.join("val.bin").is_file(),
            "{} is a directory without train.bin and val.bin: give nanoGPT's token files, or --data FILE for a UTF-8 text",
            path.display()
        );
        return Ok((path, true));
    }
    Ok((path, false))
}

/// The vocabulary of `--dataset text`: the file's characters, sorted, GPT-2's (--tokenizer
/// gpt2), or --vocab-size ids.
pub fn text_vocabulary(args: &Args) -> anyhow::Result<TextVocabulary> {
    let (path, bins) = text_source(args)?;
    match (args.tokenizer, bins) {
        (Some(TokenizerKind::Gpt2), _) => {
            if let Some(size) = args.vocab_size.filter(|&size| size != gpt2::VOCAB_SIZE) {
                anyhow::bail!(
                    "--tokenizer gpt2 has GPT-2's {} ids, not --vocab-size {size}: leave --vocab-size out",
                    gpt2::VOCAB_SIZE
                );
            }
            Ok(TextVocabulary::Gpt2)
        }
        (Some(TokenizerKind::Char), true) => anyhow::bail!(
            "{} holds token ids, not characters: give --tokenizer gpt2 if they are GPT-2's, else leave --tokenizer out and give --vocab-size",
            path.display()
        ),
        (_, true) => {
            let Some(size) = args.vocab_size else {
                anyhow::bail!(
                    "{} holds token ids: give their tokenizer's --vocab-size (GPT-2's is 50257), or --tokenizer gpt2",
                    path.display()
                );
            };
            Ok(TextVocabulary::Ids(size))
        }
        (_, false) => Ok(TextVocabulary::Chars(CharVocab::of(&text::read_text(&path)?))),
    }
}

/// Training and validation windows of --block-size tokens (the model's context by default).
fn load_text(args: &Args) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    // The window is the model's context (the vocabulary size plays no part in it).
    let preset = lockstep_core::models::GptConfig::named(&args.model);
    let block = preset.map_or(64, |p| super::setup::gpt_config(args, p, 1).block_size);
    let (path, bins) = text_source(args)?;
    let vocab = text_vocabulary(args)?;
    let (train, val) = match vocab {
        _ if bins => text::token_bins(&path, block, vocab.size())?,
        TextVocabulary::Gpt2 => {
            let text = gpt2_text::gpt2_text(&path, block)?;
            say_how_tokenized(&path, &text);
            (text.train, text.val)
        }
        _ => {
            let (_, train, val) = text::char_text(&path, block)?;
            (train, val)
        }
    };
    Ok((Arc::new(train), Arc::new(val)))
}

/// One line on where a text's GPT-2 ids came from: tokenized now (and why), or its cache.
fn say_how_tokenized(path: &Path, text: &gpt2_text::Gpt2Text) {
    let (path, cache, tokens) = (path.display(), text.cache.display(), text.tokens);
    match &text.cache_use {
        CacheUse::Reused => eprintln_whole!("{tokens} GPT-2 tokens of {path}, from {cache}"),
        CacheUse::Made => eprintln_whole!("tokenized {path} with GPT-2's BPE: {tokens} tokens, cached in {cache}"),
        CacheUse::Remade(why) => {
            eprintln_whole!("tokenized {path} with GPT-2's BPE again ({cache}: {why}): {tokens} tokens")
        }
    }
}

/// The training and validation folders: DIR/train and DIR/val (or DIR/test) when DIR has a
/// train/ folder, else DIR for both (said once, as validating on training images flatters).
fn folder_roots(args: &Args) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let Some(dir) = args.data.clone() else {
        anyhow::bail!("--dataset folder needs --data DIR: a folder with one subdirectory of images per class");
    };
    let train = dir.join("train");
    if !train.is_dir() {
        return Ok((dir.clone(), dir));
    }
    let val = ["val", "test"].iter().map(|n| dir.join(n)).find(|p| p.is_dir());
    match val {
        Some(val) => Ok((train, val)),
        None => anyhow::bail!(
            "{} has a train/ folder but no val/ or test/ beside it: add one with the same class folders, or pass --data {}",
            dir.display(),
            train.display()
        ),
    }
}

/// A folder of images by class, resized to --image-size, augmented unless --no-augment.
fn load_folder(args: &Args) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let (train_dir, val_dir) = folder_roots(args)?;
    if train_dir == val_dir {
        eprintln_whole!(
            "note: {} has no train/ and val/ folders: validating on the training images",
            train_dir.display()
        );
    }
    let open = |dir: &Path| -> anyhow::Result<ImageFolder> {
        let (images, warnings) = ImageFolder::open(dir, args.image_size, args.skip_bad_images)?;
        warnings.iter().for_each(|w| eprintln_whole!("warning: {w}"));
        Ok(images)
    };
    let (train, val) = (open(&train_dir)?, open(&val_dir)?);
    anyhow::ensure!(
        train.class_names() == val.class_names(),
        "{} and {} hold different class folders ({:?} against {:?}): give both the same classes",
        train_dir.display(),
        val_dir.display(),
        train.class_names(),
        val.class_names()
    );
    let augment = if args.no_augment {
        Augment::NONE
    } else {
        Augment {
            crop_padding: Some(args.image_size / 8),
            horizontal_flip: true,
        }
    };
    image_sets(train, val, augment, IMAGENET_MEAN_STD, args.seed)
}

/// A training and a test set of images as data sets: both normalised by `mean_std`, the
/// training images augmented by `augment`.
fn image_sets(
    train: impl ImageSource + 'static,
    test: impl ImageSource + 'static,
    augment: Augment,
    (mean, std): ([f32; 3], [f32; 3]),
    seed: u64,
) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let serve = |images: Arc<dyn ImageSource>, augment| -> anyhow::Result<Arc<dyn Dataset>> {
        let normalize = Normalize::new(&mean, &std);
        Ok(Arc::new(ImageClassification::new(images, augment, normalize, seed)?))
    };
    Ok((serve(Arc::new(train), augment)?, serve(Arc::new(test), Augment::NONE)?))
}

/// CIFAR's training set, augmented unless --no-augment, and its test set, both normalised by
/// the training set's per-channel mean and deviation.
fn load_cifar(args: &Args, kind: cifar::Kind) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let path = args.data_dir()?;
    ensure_cifar(&path, kind, args)?;
    let (train, test) = Cifar::load_train_test(&path, kind)?;
    let augment = if args.no_augment { Augment::NONE } else { Augment::CIFAR };
    image_sets(train, test, augment, kind.mean_std(), args.seed)
}

fn load_mnist(args: &Args) -> anyhow::Result<(Arc<dyn Dataset>, Arc<dyn Dataset>)> {
    let dir = args.data_dir()?;
    ensure_mnist(&dir, args)?;
    let train: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Train)?);
    let test: Arc<dyn Dataset> = Arc::new(Mnist::load(&dir, Split::Test)?);
    Ok((train, test))
}

/// Fetches what `dir` lacks when the run may download, else refuses naming what is missing.
fn ensure_mnist(dir: &Path, args: &Args) -> anyhow::Result<()> {
    let missing = mnist::missing(dir);
    if missing.is_empty() {
        return Ok(());
    }
    let ways_out = "or pass --data DIR naming a directory that has them";
    if !args.downloads() {
        anyhow::bail!(
            "MNIST not found in {}: {} missing\n  {} to fetch them there, {ways_out}",
            dir.display(),
            gz_names(&missing),
            args.how_to_download()
        );
    }
    if args.data.is_none() {
        eprintln_whole!("MNIST is not in {} yet: downloading it there", dir.display());
    }
    let base = args.download_url.as_deref().unwrap_or(download::DEFAULT_BASE_URL);
    download::fetch_missing(dir, base, &download::CONTENT_SHA256, !args.headless).map_err(|e| {
        anyhow::anyhow!(
            "cannot download MNIST into {}: {e:#}\n  retry online, pass --download-url BASE for a mirror, put the four files there ({}), {ways_out}",
            dir.display(),
            gz_names(&mnist::FILES)
        )
    })?;
    Ok(())
}

/// Fetches `kind`'s archive into `dir` when it is not there and the run may download, else
/// refuses saying where it looked and the ways out.
fn ensure_cifar(dir: &Path, kind: cifar::Kind, args: &Args) -> anyhow::Result<()> {
    if cifar::locate(dir, kind).is_some() {
        return Ok(());
    }
    let ways_out = format!(
        "or put {} (or its folder {}) there, or pass --data naming where it is",
        kind.archive(),
        kind.folder()
    );
    if !args.downloads() {
        anyhow::bail!(
            "{} not found in {}: expected its folder {}, the batch files, or the published {}\n  {} to fetch it there (about 170 MB), {ways_out}",
            kind.name(),
            dir.display(),
            kind.folder(),
            kind.archive(),
            args.how_to_download()
        );
    }
    if args.data.is_none() {
        eprintln_whole!("{} is not in {} yet: downloading it there", kind.name(), dir.display());
    }
    let base = args.download_url.as_deref().unwrap_or(download::CIFAR_BASE_URL);
    // Tests serve a small archive of their own: they name its checksum instead of the published one.
    let md5 = std::env::var("LOCKSTEP_TEST_CIFAR_MD5").unwrap_or_else(|_| download::cifar_md5(kind).to_string());
    download::fetch_cifar(dir, base, kind, &md5, !args.headless).map_err(|e| {
        anyhow::anyhow!(
            "cannot download {} into {}: {e:#}\n  retry online, pass --download-url BASE for a mirror, {ways_out}",
            kind.name(),
            dir.display()
        )
    })?;
    Ok(())
}

fn gz_names(names: &[&str]) -> String {
    names.iter().map(|n| format!("{n}.gz")).collect::<Vec<_>>().join(", ")
}
