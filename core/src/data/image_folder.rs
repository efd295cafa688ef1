//! A folder of images by class, as torchvision's `ImageFolder` reads it: one subdirectory per
//! class (classes sorted by name, numbered from 0), PNG and JPEG files inside (sorted by path;
//! other files ignored). Images are decoded and resized to a square in the loader's workers.

use std::path::{Path, PathBuf};

use super::image::ImageSource;
use crate::error::{Error, Result};

/// The extensions read as images (case-insensitive).
const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// A folder of class subfolders as an `ImageSource` (torchvision's `ImageFolder`); each image is
/// decoded and resized to a square RGB image when read.
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    /// Every image's path and class.
    files: Vec<(PathBuf, u32)>,
    size: usize,
}

/// Per-channel mean and deviation of ImageNet's training images, torchvision's usual Normalize.
pub const IMAGENET_MEAN_STD: ([f32; 3], [f32; 3]) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);

impl ImageFolder {
    /// Lists `root`'s classes and images, to be served as `size`x`size` RGB. With
    /// `skip_bad_images`, a file whose header does not read as an image is left out and
    /// reported in the returned warnings; without it, such a file is an error when read.
    pub fn open(root: impl AsRef<Path>, size: usize, skip_bad_images: bool) -> Result<(ImageFolder, Vec<String>)> {
        let root = root.as_ref().to_path_buf();
        if size == 0 {
            return Err(Error::invalid("ImageFolder", "the image size must be at least 1 pixel"));
        }
        let classes = class_names(&root)?;
        let mut files = Vec::new();
        let mut warnings = Vec::new();
        for (class, name) in classes.iter().enumerate() {
            let mut images = Vec::new();
            collect_images(&root.join(name), &mut images)?;
            images.sort();
            for path in images {
                if skip_bad_images && let Err(e) = header(&path) {
                    warnings.push(format!("skipping {}: {e}", path.display()));
                    continue;
                }
                files.push((path, class as u32));
            }
        }
        if files.is_empty() {
            return Err(Error::data(
                root.display().to_string(),
                format!(
                    "no images found: expected one subdirectory per class holding {} files (found {} class folders)",
                    EXTENSIONS.join("/"),
                    classes.len()
                ),
            ));
        }
        let folder = ImageFolder {
            root,
            classes,
            files,
            size,
        };
        Ok((folder, warnings))
    }
    /// The class names, in the order of their numbers.
    pub fn class_names(&self) -> &[String] {
        &self.classes
    }
    /// The folder it was opened at.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl ImageSource for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }
    fn shape(&self) -> [usize; 3] {
        [3, self.size, self.size]
    }
    fn classes(&self) -> usize {
        self.classes.len()
    }
    fn read(&self, index: usize, out: &mut [u8]) -> Result<u32> {
        let (path, class) = self.files.get(index).ok_or_else(|| {
            Error::data(
                format!("image {index} of {}", self.root.display()),
                format!("out of range: the folder has {} images", self.files.len()),
            )
        })?;
        let image = image::ImageReader::open(path)
            .map_err(|e| Error::io(path, e))?
            .with_guessed_format()
            .map_err(|e| Error::io(path, e))?
            .decode()
            .map_err(|e| unreadable(path, &e.to_string()))?
            .to_rgb8();
        let side = self.size as u32;
        let image = if image.dimensions() == (side, side) {
            image
        } else {
            image::imageops::resize(&image, side, side, image::imageops::FilterType::Triangle)
        };
        let plane = self.size * self.size;
        for (p, pixel) in image.pixels().enumerate() {
            for c in 0..3 {
                out[c * plane + p] = pixel.0[c];
            }
        }
        Ok(*class)
    }
}

/// `root`'s class folders, sorted by name: class `i` is the `i`-th (a model's output count,
/// without listing every image).
pub fn class_names(root: &Path) -> Result<Vec<String>> {
    let mut classes: Vec<String> = sorted_entries(root)?
        .into_iter()
        .filter(|p| p.is_dir())
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect();
    classes.sort();
    Ok(classes)
}

fn unreadable(path: &Path, why: &str) -> Error {
    Error::data(
        path.display().to_string(),
        format!("cannot be read as an image ({why}); replace or remove it, or pass --skip-bad-images"),
    )
}

/// Reads only the header: enough to reject a file that is not an image at all.
fn header(path: &Path) -> std::result::Result<(u32, u32), String> {
    image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(|e| e.to_string())?
        .into_dimensions()
        .map_err(|e| e.to_string())
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect::<Result<_>>()?;
    entries.sort();
    Ok(entries)
}

/// Every image file under `dir`, in its subdirectories too (torchvision walks them as well;
/// linked directories are not followed, so a link cycle cannot recurse forever).
fn collect_images(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for path in sorted_entries(dir)? {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            collect_images(&path, out)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
        {
            out.push(path);
        }
    }
    Ok(())
}
