//! Image classification data: a source of same-sized byte images and their classes (CIFAR, a
//! folder of images), served as a `Dataset` of normalised float batches, augmented per epoch.

use std::sync::Arc;

use super::augment::{Augment, Normalize, render};
use super::batch::{Batch, HostTensor};
use super::dataset::{Dataset, Sample};
use crate::dtype::HostVec;
use crate::error::{Error, Result};

/// Images of one shape as bytes (`[c, h, w]`, 0-255) and their classes.
pub trait ImageSource: Send + Sync {
    /// Number of images.
    fn len(&self) -> usize;
    /// True when there are no images.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `[channels, height, width]` of every image.
    fn shape(&self) -> [usize; 3];
    /// Number of classes; every class that `read` returns is below it.
    fn classes(&self) -> usize;
    /// Writes image `index` into `out` (`c·h·w` bytes) and returns its class; an error names
    /// the image (and its file, where it has one).
    fn read(&self, index: usize, out: &mut [u8]) -> Result<u32>;
}

/// `[n, c, h, w]` f32 images and `[n]` u32 classes from an `ImageSource`, each image augmented
/// with the draws of (seed, epoch, index) and normalised per channel.
pub struct ImageClassification {
    source: Arc<dyn ImageSource>,
    augment: Augment,
    normalize: Normalize,
    seed: u64,
}

impl ImageClassification {
    /// Serves `source` normalised by `normalize` (one mean and std per channel), augmented by
    /// `augment` from `seed`.
    pub fn new(source: Arc<dyn ImageSource>, augment: Augment, normalize: Normalize, seed: u64) -> Result<Self> {
        let channels = source.shape()[0];
        if normalize.channels() != channels {
            return Err(Error::invalid(
                "ImageClassification",
                format!(
                    "Normalize has {} channels but the images have {channels}",
                    normalize.channels()
                ),
            ));
        }
        Ok(ImageClassification {
            source,
            augment,
            normalize,
            seed,
        })
    }
    /// The images and classes it serves.
    pub fn source(&self) -> &Arc<dyn ImageSource> {
        &self.source
    }
}

impl Dataset for ImageClassification {
    fn len(&self) -> usize {
        self.source.len()
    }
    fn get(&self, index: usize) -> Result<Sample> {
        Ok(self.get_batch(&[index])?.into_sample())
    }
    fn get_batch(&self, indices: &[usize]) -> Result<Batch> {
        self.get_batch_at(0, indices)
    }
    fn get_batch_at(&self, epoch: u64, indices: &[usize]) -> Result<Batch> {
        let shape = self.source.shape();
        let size: usize = shape.iter().product();
        let mut bytes = vec![0u8; size];
        let mut images = vec![0f32; indices.len() * size];
        let mut labels = Vec::with_capacity(indices.len());
        for (&index, out) in indices.iter().zip(images.chunks_exact_mut(size)) {
            labels.push(self.source.read(index, &mut bytes)?);
            let placement = self.augment.draw(self.seed, epoch, index);
            render(&bytes, shape, &placement, &self.normalize, out);
        }
        let n = indices.len();
        Ok(Batch {
            fields: vec![
                HostTensor::new(HostVec::F32(images), [n, shape[0], shape[1], shape[2]])?,
                HostTensor::new(HostVec::U32(labels), [n])?,
            ],
            indices: indices.to_vec(),
        })
    }
}
