//! CIFAR-10 and CIFAR-100, binary version: records of label byte(s) then 3072 pixel bytes (a
//! 32x32 image, channel by channel), read from the extracted directory or straight from the
//! published `.tar.gz` without unpacking it. Every check names the file and what was expected.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::image::ImageSource;
use crate::error::{Error, Result};

/// Pixels of one image: 3 channels of 32x32.
pub const PIXELS: usize = 3 * 32 * 32;

/// Which CIFAR data set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// 10 classes; training data in 5 batch files of 10000 images.
    Cifar10,
    /// The 100 fine classes (each record also holds one of 20 coarse ones, which is read past).
    Cifar100,
}

/// Which split: 50000 training or 10000 test images (both data sets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The 50000 training images.
    Train,
    /// The 10000 test images.
    Test,
}

impl Split {
    /// Images in the split, in either data set.
    pub fn images(self) -> usize {
        match self {
            Split::Train => 50_000,
            Split::Test => 10_000,
        }
    }
}

impl Kind {
    /// The display name, `CIFAR-10` or `CIFAR-100`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cifar10 => "CIFAR-10",
            Kind::Cifar100 => "CIFAR-100",
        }
    }
    /// The folder the published archive unpacks into.
    pub fn folder(self) -> &'static str {
        match self {
            Kind::Cifar10 => "cifar-10-batches-bin",
            Kind::Cifar100 => "cifar-100-binary",
        }
    }
    /// The published archive's file name.
    pub fn archive(self) -> &'static str {
        match self {
            Kind::Cifar10 => "cifar-10-binary.tar.gz",
            Kind::Cifar100 => "cifar-100-binary.tar.gz",
        }
    }
    /// Number of classes: 10, or CIFAR-100's 100 fine classes.
    pub fn classes(self) -> usize {
        match self {
            Kind::Cifar10 => 10,
            Kind::Cifar100 => 100,
        }
    }
    /// Label bytes before each image: the class, or CIFAR-100's coarse then fine class.
    fn label_bytes(self) -> usize {
        match self {
            Kind::Cifar10 => 1,
            Kind::Cifar100 => 2,
        }
    }
    /// Bytes per record in a batch file: the label byte(s), then `PIXELS`.
    pub fn record_bytes(self) -> usize {
        self.label_bytes() + PIXELS
    }
    /// The batch files of `split`, in order.
    pub fn files(self, split: Split) -> &'static [&'static str] {
        match (self, split) {
            (Kind::Cifar10, Split::Train) => &[
                "data_batch_1.bin",
                "data_batch_2.bin",
                "data_batch_3.bin",
                "data_batch_4.bin",
                "data_batch_5.bin",
            ],
            (Kind::Cifar10, Split::Test) => &["test_batch.bin"],
            (Kind::Cifar100, Split::Train) => &["train.bin"],
            (Kind::Cifar100, Split::Test) => &["test.bin"],
        }
    }
    /// The most bytes the batch file `name` holds: its share of its split's images, whole
    /// records. None for a file that is not one of the kind's.
    pub fn file_bytes(self, name: &str) -> Option<usize> {
        [Split::Train, Split::Test].into_iter().find_map(|split| {
            let files = self.files(split);
            files
                .contains(&name)
                .then(|| split.images() / files.len() * self.record_bytes())
        })
    }
    /// Per-channel mean and standard deviation of the training images (in [0, 1]).
    pub fn mean_std(self) -> ([f32; 3], [f32; 3]) {
        match self {
            Kind::Cifar10 => ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
            Kind::Cifar100 => ([0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762]),
        }
    }
}

/// Where the batch files are: a directory holding them, or the published archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A directory holding the `.bin` batch files.
    Directory(PathBuf),
    /// The published `.tar.gz`, read without unpacking.
    Archive(PathBuf),
}

/// Finds `kind`'s files from `path`: the archive itself, a directory holding the batch files, the
/// folder the archive unpacks into, or the archive, in that order. None when nothing is there.
pub fn locate(path: &Path, kind: Kind) -> Option<Location> {
    if path.is_file() {
        return Some(Location::Archive(path.to_path_buf()));
    }
    let has_files = |dir: &Path| kind.files(Split::Train).iter().any(|f| dir.join(f).is_file());
    if has_files(path) {
        return Some(Location::Directory(path.to_path_buf()));
    }
    let unpacked = path.join(kind.folder());
    if has_files(&unpacked) {
        return Some(Location::Directory(unpacked));
    }
    let archive = path.join(kind.archive());
    archive.is_file().then_some(Location::Archive(archive))
}

/// One split in memory: images as bytes, channel-major, and their classes.
pub struct Cifar {
    kind: Kind,
    images: Vec<u8>,
    labels: Vec<u8>,
}

impl Cifar {
    /// Loads `split` of `kind` from `path` (see [`locate`]).
    pub fn load(path: impl AsRef<Path>, kind: Kind, split: Split) -> Result<Cifar> {
        let mut splits = Cifar::load_splits(path.as_ref(), kind, &[split])?;
        Ok(splits.remove(0))
    }

    /// Loads the training and the test split, reading an archive once.
    pub fn load_train_test(path: impl AsRef<Path>, kind: Kind) -> Result<(Cifar, Cifar)> {
        let mut splits = Cifar::load_splits(path.as_ref(), kind, &[Split::Train, Split::Test])?;
        let test = splits.remove(1);
        Ok((splits.remove(0), test))
    }

    fn load_splits(path: &Path, kind: Kind, splits: &[Split]) -> Result<Vec<Cifar>> {
        let names: Vec<&str> = splits.iter().flat_map(|s| kind.files(*s).iter().copied()).collect();
        let files = match locate(path, kind) {
            Some(Location::Directory(dir)) => read_directory(&dir, kind, &names)?,
            Some(Location::Archive(archive)) => {
                let file = std::fs::File::open(&archive).map_err(|e| Error::io(&archive, e))?;
                let what = archive.display().to_string();
                return Cifar::from_archive(std::io::BufReader::new(file), &what, kind, splits);
            }
            None => {
                return Err(Error::data(
                    format!("{} in {}", kind.name(), path.display()),
                    format!(
                        "not found: expected {} (or the folder {} holding them, or the published {})",
                        names.join(", "),
                        kind.folder(),
                        kind.archive()
                    ),
                ));
            }
        };
        Cifar::split_files(kind, splits, files)
    }

    /// Loads `splits` of `kind` from the published `.tar.gz` as a stream of bytes (named `what` in
    /// errors), reading it once; one `Cifar` per split, in that order.
    pub fn from_archive(archive: impl Read, what: &str, kind: Kind, splits: &[Split]) -> Result<Vec<Cifar>> {
        let names: Vec<&str> = splits.iter().flat_map(|s| kind.files(*s).iter().copied()).collect();
        let files = read_archive(archive, what, kind, &names)?;
        Cifar::split_files(kind, splits, files)
    }

    /// One split of `kind` from the contents of its batch files, as `(name, bytes)` pairs in the
    /// order of [`Kind::files`] (the names only say in errors which file is wrong).
    pub fn from_batches(kind: Kind, batches: &[(String, Vec<u8>)]) -> Result<Cifar> {
        let mut cifar = Cifar {
            kind,
            images: Vec::new(),
            labels: Vec::new(),
        };
        for (name, bytes) in batches {
            cifar.append(name, bytes)?;
        }
        Ok(cifar)
    }

    /// Deals `files` (the batch files of `splits`, in order) out to one `Cifar` per split.
    fn split_files(kind: Kind, splits: &[Split], files: Vec<(String, Vec<u8>)>) -> Result<Vec<Cifar>> {
        let mut files = files.as_slice();
        splits
            .iter()
            .map(|split| {
                let (these, rest) = files.split_at(kind.files(*split).len().min(files.len()));
                files = rest;
                Cifar::from_batches(kind, these)
            })
            .collect()
    }

    /// Appends the records of one batch file, checking its size and labels.
    fn append(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let record = self.kind.record_bytes();
        if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
            return Err(Error::data(
                name,
                format!(
                    "{} bytes is not a whole number of {record}-byte {} records ({} label byte(s), then {PIXELS} pixels): the file is truncated or not {} binary data",
                    bytes.len(),
                    self.kind.name(),
                    self.kind.label_bytes(),
                    self.kind.name()
                ),
            ));
        }
        for (i, r) in bytes.chunks_exact(record).enumerate() {
            let label = r[self.kind.label_bytes() - 1];
            if label as usize >= self.kind.classes() {
                return Err(Error::data(
                    name,
                    format!(
                        "record {i} has class {label}, but {} has {} classes: not a {} file",
                        self.kind.name(),
                        self.kind.classes(),
                        self.kind.name()
                    ),
                ));
            }
            self.labels.push(label);
            self.images.extend_from_slice(&r[self.kind.label_bytes()..]);
        }
        Ok(())
    }

    /// Which data set this split is of.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The class of image `index`.
    pub fn label(&self, index: usize) -> Option<u8> {
        self.labels.get(index).copied()
    }
}

impl ImageSource for Cifar {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn shape(&self) -> [usize; 3] {
        [3, 32, 32]
    }
    fn classes(&self) -> usize {
        self.kind.classes()
    }
    fn read(&self, index: usize, out: &mut [u8]) -> Result<u32> {
        let label = self.label(index).ok_or_else(|| {
            Error::data(
                format!("{} image {index}", self.kind.name()),
                format!("out of range: the split has {} images", self.labels.len()),
            )
        })?;
        out.copy_from_slice(&self.images[index * PIXELS..(index + 1) * PIXELS]);
        Ok(label as u32)
    }
}

/// The batch files `names` from `dir`, in that order.
fn read_directory(dir: &Path, kind: Kind, names: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    names
        .iter()
        .map(|name| {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(Error::data(
                    path.display().to_string(),
                    format!(
                        "missing: {} needs {} in {}",
                        kind.name(),
                        names.join(", "),
                        dir.display()
                    ),
                ));
            }
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            Ok((path.display().to_string(), bytes))
        })
        .collect()
}

/// Reads the batch files `wanted` out of a gzipped tar archive (named `what` in errors), in that
/// order, in one pass.
fn read_archive(archive: impl Read, what: &str, kind: Kind, wanted: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let corrupt = |e: std::io::Error| {
        Error::data(
            what,
            format!("cannot read the archive ({e}): it is truncated or corrupt; download it again"),
        )
    };
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut found: Vec<Option<Vec<u8>>> = vec![None; wanted.len()];
    for entry in tar.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let path = entry.path().map_err(corrupt)?.into_owned();
        let Some(slot) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| wanted.iter().position(|w| *w == n))
        else {
            continue;
        };
        // The header's size is outside input, not even a hint: a tiny archive may claim
        // gigabytes. The buffer grows with the bytes that are really there, up to the format's
        // size for the file: past it, a small archive inflating to gigabytes (a decompression
        // bomb) is refused at the first byte too many.
        let most = kind.file_bytes(wanted[slot]).unwrap_or(0) as u64;
        let mut bytes = Vec::new();
        (&mut entry).take(most + 1).read_to_end(&mut bytes).map_err(corrupt)?;
        if bytes.len() as u64 > most {
            return Err(Error::data(
                format!("{what}:{}", wanted[slot]),
                format!(
                    "holds more than the {most} bytes of a {} batch file: not CIFAR's archive (a decompression bomb?)",
                    kind.name()
                ),
            ));
        }
        found[slot] = Some(bytes);
    }
    wanted
        .iter()
        .zip(found)
        .map(|(name, bytes)| {
            let what = format!("{what}:{name}");
            bytes.map(|b| (what.clone(), b)).ok_or_else(|| {
                Error::data(
                    what,
                    format!("missing from the archive: {} needs {}", kind.name(), wanted.join(", ")),
                )
            })
        })
        .collect()
}
