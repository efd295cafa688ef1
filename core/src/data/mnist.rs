//! MNIST from the four standard IDX files (gzipped or raw) in a directory, normalised as
//! `(x/255 - 0.1307) / 0.3081`. Every check says which file is wrong and how.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::batch::{Batch, HostTensor};
use super::dataset::{Dataset, Sample};
use crate::dtype::HostVec;
use crate::error::{Error, Result};

/// The mean of MNIST's training pixels in [0, 1], subtracted by the normalisation.
pub const MEAN: f32 = 0.1307;
/// The standard deviation of MNIST's training pixels, divided out by the normalisation.
pub const STD: f32 = 0.3081;
/// Number of classes: the digits 0 to 9.
pub const CLASSES: usize = 10;

/// Which MNIST split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// The 60000 training images.
    Train,
    /// The 10000 test images (the `t10k` files).
    Test,
}

impl Split {
    /// The standard file names (without `.gz`) of (images, labels).
    pub fn file_names(self) -> (&'static str, &'static str) {
        match self {
            Split::Train => ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
            Split::Test => ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        }
    }
}

/// All four file names, as a download or a setup message needs them.
pub const FILES: [&str; 4] = [
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
];

/// One MNIST split in memory, served as normalised `[n, 1, 28, 28]` f32 images and `[n]` u32
/// labels.
pub struct Mnist {
    images: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
    /// Normalised value of each byte, computed once.
    lut: [f32; 256],
}

/// The standard files that `dir` lacks (neither raw nor gzipped there), in the order of [`FILES`].
pub fn missing(dir: &Path) -> Vec<&'static str> {
    FILES.into_iter().filter(|name| locate(dir, name).is_err()).collect()
}

/// Finds `name` or `name.gz` in `dir`.
pub fn locate(dir: &Path, name: &str) -> Result<PathBuf> {
    [dir.join(name), dir.join(format!("{name}.gz"))]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::data(
                format!("MNIST file {name}(.gz)"),
                format!(
                    "not found in {}; put the four standard files there ({}), each raw or gzipped",
                    dir.display(),
                    FILES.join(", ")
                ),
            )
        })
}

/// The contents of an IDX file of `dims` dimensions (`what` in errors), inflated when they start
/// with the gzip magic bytes: at most as far as its header's dimensions say, so a small file
/// that inflates to gigabytes (a decompression bomb) is refused at the first byte past them.
fn inflate_if_gz(what: &str, raw: Vec<u8>, dims: usize) -> Result<Vec<u8>> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let corrupt = |e: std::io::Error| {
        Error::data(
            what,
            format!("corrupt or truncated gzip data ({e}); download the file again"),
        )
    };
    let mut decoder = flate2::read::MultiGzDecoder::new(&raw[..]);
    let header = 4 + 4 * dims;
    let mut out = Vec::new();
    (&mut decoder)
        .take(header as u64)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if out.len() < header {
        return Ok(out); // `parse_idx` says it is too short
    }
    let (_, payload) = parse_idx_header(what, &out, dims)?;
    let payload = payload.map_or(u64::MAX, |p| p as u64);
    // One byte past the payload tells a file that ends there from one that goes on.
    decoder
        .take(payload.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if (out.len() - header) as u64 > payload {
        return Err(Error::data(
            what,
            format!(
                "inflates past the {payload} bytes of data its header declares: not an MNIST file (a decompression bomb?)"
            ),
        ));
    }
    Ok(out)
}

fn be_u32(bytes: &[u8], at: usize) -> usize {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
}

/// Checks an IDX header's magic (`0x0000_08_dims` for unsigned bytes); returns its dimensions
/// and the bytes of data they declare (None past `usize::MAX`). `bytes` holds at least the
/// header.
fn parse_idx_header(what: &str, bytes: &[u8], dims: usize) -> Result<(Vec<usize>, Option<usize>)> {
    let magic = be_u32(bytes, 0);
    let expected = 0x0800 + dims;
    if magic != expected {
        return Err(Error::data(
            what,
            format!(
                "magic number {magic:#010x}, expected {expected:#010x} (IDX, unsigned bytes, {dims} dimensions): not an MNIST {} file",
                if dims == 1 { "label" } else { "image" }
            ),
        ));
    }
    let shape: Vec<usize> = (0..dims).map(|d| be_u32(bytes, 4 + 4 * d)).collect();
    // Innermost first, so that the size of one item (an image's rows x columns) is checked too,
    // even when the count before it is 0: outside input, it may not fit in a usize.
    let payload = shape.iter().rev().try_fold(1usize, |n, &d| n.checked_mul(d));
    Ok((shape, payload))
}

/// Checks an IDX header and the payload length; returns the dimensions and the payload.
fn parse_idx(what: &str, bytes: Vec<u8>, dims: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let header = 4 + 4 * dims;
    if bytes.len() < header {
        return Err(Error::data(
            what,
            format!(
                "only {} bytes: too short for an IDX header of {header} bytes (truncated file?)",
                bytes.len()
            ),
        ));
    }
    let (shape, payload) = parse_idx_header(what, &bytes, dims)?;
    let actual = bytes.len() - header;
    if payload != Some(actual) {
        let payload = payload.map_or("more than usize::MAX".to_string(), |p| p.to_string());
        return Err(Error::data(
            what,
            format!(
                "header says {shape:?} ({payload} bytes of data) but the file holds {actual} bytes (truncated or corrupt)"
            ),
        ));
    }
    let mut bytes = bytes;
    bytes.drain(..header);
    Ok((shape, bytes))
}

impl Mnist {
    /// Loads one split from `dir`.
    pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<Mnist> {
        let dir = dir.as_ref();
        let (images_name, labels_name) = split.file_names();
        let (images_path, labels_path) = (locate(dir, images_name)?, locate(dir, labels_name)?);
        let read = |path: &Path| std::fs::read(path).map_err(|e| Error::io(path, e));
        Mnist::from_bytes(
            (&images_path.display().to_string(), read(&images_path)?),
            (&labels_path.display().to_string(), read(&labels_path)?),
        )
    }

    /// One split from the contents of its image and label files, each raw or gzipped, as `load`
    /// reads them: `(name, bytes)` pairs, the names only saying in errors which file is wrong.
    pub fn from_bytes(images: (&str, Vec<u8>), labels: (&str, Vec<u8>)) -> Result<Mnist> {
        let ((images_what, images), (labels_what, labels)) = (images, labels);
        let (image_shape, images) = parse_idx(images_what, inflate_if_gz(images_what, images, 3)?, 3)?;
        let (label_shape, labels) = parse_idx(labels_what, inflate_if_gz(labels_what, labels, 1)?, 1)?;
        if image_shape[0] != label_shape[0] {
            return Err(Error::data(
                format!("{images_what} and {labels_what}"),
                format!(
                    "{} images but {} labels: the files do not belong together",
                    image_shape[0], label_shape[0]
                ),
            ));
        }
        if let Some(i) = labels.iter().position(|&l| l as usize >= CLASSES) {
            return Err(Error::data(
                labels_what,
                format!("label {} at index {i} is not a digit 0-9", labels[i]),
            ));
        }
        let mut lut = [0f32; 256];
        for (v, out) in lut.iter_mut().enumerate() {
            *out = (v as f32 / 255.0 - MEAN) / STD;
        }
        Ok(Mnist {
            images,
            labels,
            rows: image_shape[1],
            cols: image_shape[2],
            lut,
        })
    }

    /// `[1, rows, cols]` of every image, from the files' header (`[1, 28, 28]`).
    pub fn image_shape(&self) -> [usize; 3] {
        [1, self.rows, self.cols]
    }
    /// The raw label of sample `index`.
    pub fn label(&self, index: usize) -> Option<u8> {
        self.labels.get(index).copied()
    }
    fn check_index(&self, index: usize) -> Result<()> {
        if index >= self.labels.len() {
            return Err(Error::data(
                format!("MNIST sample {index}"),
                format!("out of range: the split has {} samples", self.labels.len()),
            ));
        }
        Ok(())
    }
}

impl Dataset for Mnist {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<Sample> {
        self.get_batch(&[index]).map(Batch::into_sample)
    }

    /// Builds the batch's image tensor `[n, 1, rows, cols]` and labels `[n]` (u32) in one pass.
    fn get_batch(&self, indices: &[usize]) -> Result<Batch> {
        // Indices first: a split of no images may still claim images too large to allocate.
        indices.iter().try_for_each(|&i| self.check_index(i))?;
        let pixels = self.rows * self.cols;
        let mut images = Vec::with_capacity(indices.len() * pixels);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend(
                self.images[i * pixels..(i + 1) * pixels]
                    .iter()
                    .map(|&b| self.lut[b as usize]),
            );
            labels.push(self.labels[i] as u32);
        }
        let n = indices.len();
        Ok(Batch {
            fields: vec![
                HostTensor::new(HostVec::F32(images), [n, 1, self.rows, self.cols])?,
                HostTensor::new(HostVec::U32(labels), [n])?,
            ],
            indices: indices.to_vec(),
        })
    }
}
