//! Training-time augmentation as torchvision's CIFAR recipe does it — RandomCrop(size,
//! padding) with zero padding, then RandomHorizontalFlip — and per-channel Normalize. The random
//! choices of a sample are a function of (seed, epoch, sample index) alone, so a batch comes out
//! the same whichever loader worker builds it, and a mid-epoch resume sees the same crops.

use crate::rng::philox4x32;

/// Which random transforms a training image goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Augment {
    /// RandomCrop back to the image's size after zero padding by this many pixels on every side.
    pub crop_padding: Option<usize>,
    /// RandomHorizontalFlip with probability 1/2.
    pub horizontal_flip: bool,
}

impl Augment {
    /// No augmentation (evaluation, or exact comparisons).
    pub const NONE: Augment = Augment {
        crop_padding: None,
        horizontal_flip: false,
    };
    /// The standard CIFAR recipe: RandomCrop(32, padding=4) and RandomHorizontalFlip.
    pub const CIFAR: Augment = Augment {
        crop_padding: Some(4),
        horizontal_flip: true,
    };

    /// The choices for one sample: the crop's offset into the padded image and whether it flips.
    pub(crate) fn draw(&self, seed: u64, epoch: u64, index: usize) -> Placement {
        // A stream of its own (the key), counted by (epoch, index): independent of shuffling's.
        let words = philox4x32(seed ^ 0x6175_676d_656e_7421, (epoch << 32) ^ index as u64);
        // Offsets in 0..=2p from 32-bit words: the modulo's bias is below 1e-8 for such small p.
        let (dy, dx) = match self.crop_padding {
            Some(p) => (words[0] as usize % (2 * p + 1), words[1] as usize % (2 * p + 1)),
            None => (0, 0),
        };
        Placement {
            padding: self.crop_padding.unwrap_or(0),
            dy,
            dx,
            flip: self.horizontal_flip && words[2] & 1 == 1,
        }
    }
}

/// Where one augmented image reads its pixels from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    padding: usize,
    dy: usize,
    dx: usize,
    flip: bool,
}

impl Placement {
    /// The source pixel of output pixel (y, x) in an h x w image, None in the zero padding:
    /// crop from the padded image at (dy, dx), then mirror the crop's columns when flipped.
    fn source(&self, y: usize, x: usize, h: usize, w: usize) -> Option<(usize, usize)> {
        let x = if self.flip { w - 1 - x } else { x };
        let (py, px) = (y + self.dy, x + self.dx);
        let (sy, sx) = (py.checked_sub(self.padding)?, px.checked_sub(self.padding)?);
        (sy < h && sx < w).then_some((sy, sx))
    }
}

/// Per-channel `(x/255 - mean) / std`, through a lookup table per channel.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalize {
    tables: Vec<[f32; 256]>,
}

impl Normalize {
    /// One `(x/255 - mean) / std` table per channel, from `mean` and `std` in [0, 1] units
    /// (torchvision's `Normalize` after `ToTensor`).
    pub fn new(mean: &[f32], std: &[f32]) -> Normalize {
        let tables = mean
            .iter()
            .zip(std)
            .map(|(&m, &s)| std::array::from_fn(|v| (v as f32 / 255.0 - m) / s))
            .collect();
        Normalize { tables }
    }
    /// Number of channels it normalises: one per (mean, std) pair.
    pub fn channels(&self) -> usize {
        self.tables.len()
    }
}

/// Writes the augmented, normalised floats of one `[c, h, w]` byte image into `out`.
pub(crate) fn render(image: &[u8], shape: [usize; 3], placement: &Placement, normalize: &Normalize, out: &mut [f32]) {
    let [c, h, w] = shape;
    for ch in 0..c {
        let table = &normalize.tables[ch];
        let plane = &image[ch * h * w..(ch + 1) * h * w];
        for y in 0..h {
            for x in 0..w {
                let byte = placement.source(y, x, h, w).map_or(0, |(sy, sx)| plane[sy * w + sx]);
                out[(ch * h + y) * w + x] = table[byte as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crop_shifts_the_image_and_pads_with_zeros_and_a_flip_mirrors_the_crop() {
        // One 1x2x3 image; padding 1, crop offset (0, 2) in the padded 4x5 image, then a flip.
        let p = Placement {
            padding: 1,
            dy: 0,
            dx: 2,
            flip: false,
        };
        // Row 0 of the crop is the padding row; row 1 reads source row 0 from column 1 on.
        assert_eq!(p.source(0, 0, 2, 3), None);
        assert_eq!(p.source(1, 0, 2, 3), Some((0, 1)));
        assert_eq!(p.source(1, 2, 2, 3), None);
        let flipped = Placement { flip: true, ..p };
        assert_eq!(flipped.source(1, 0, 2, 3), None);
        assert_eq!(flipped.source(1, 2, 2, 3), Some((0, 1)));
    }

    #[test]
    fn draws_depend_only_on_seed_epoch_and_index_and_cover_every_offset() {
        let a = Augment::CIFAR;
        assert_eq!(a.draw(7, 3, 11), a.draw(7, 3, 11));
        let draws: Vec<Placement> = (0..2000).map(|i| a.draw(7, 0, i)).collect();
        for d in 0..=8 {
            assert!(
                draws.iter().any(|p| p.dy == d) && draws.iter().any(|p| p.dx == d),
                "offset {d} never drawn"
            );
        }
        let flips = draws.iter().filter(|p| p.flip).count();
        assert!((850..1150).contains(&flips), "{flips} flips in 2000");
        assert_ne!(a.draw(7, 0, 5), a.draw(7, 1, 5), "epochs differ");
        assert_eq!(Augment::NONE.draw(7, 0, 5).source(3, 4, 8, 8), Some((3, 4)));
    }
}
