//! A folder of images by class (torchvision's ImageFolder): classes sorted by name, images of
//! any size resized to the requested square, PNG and JPEG read alike, other files ignored, and
//! an unreadable image either an error naming it or, when asked, skipped with a warning.

use std::path::Path;
use std::sync::Arc;

use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::image_folder::ImageFolder;
use lockstep_core::data::{Dataset, ImageClassification, ImageSource};

mod scratch_support;
use scratch_support::Scratch;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("folder-{name}"))
}

/// A `w`x`h` image of one colour.
fn save(path: &Path, w: u32, h: u32, rgb: [u8; 3]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::RgbImage::from_pixel(w, h, image::Rgb(rgb)).save(path).unwrap();
}

/// Classes `cat` and `ant` (given out of order), PNG and JPEG of several sizes, a note file.
fn folder(name: &str) -> Scratch {
    let root = scratch(name);
    save(&root.join("cat/b.png"), 20, 10, [200, 10, 10]);
    save(&root.join("cat/a.jpg"), 8, 8, [200, 10, 10]);
    save(&root.join("ant/x.PNG"), 5, 9, [10, 10, 200]);
    save(&root.join("ant/deeper/y.png"), 16, 16, [10, 10, 200]);
    std::fs::write(root.join("ant/notes.txt"), "not an image").unwrap();
    root
}

#[test]
fn classes_are_sorted_images_resized_and_labelled_by_their_folder() {
    let root = folder("ok");
    let (images, warnings) = ImageFolder::open(&root, 12, false).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(images.class_names(), ["ant", "cat"]);
    assert_eq!((images.len(), images.shape(), images.classes()), (4, [3, 12, 12], 2));
    let mut pixels = vec![0u8; 3 * 12 * 12];
    let classes: Vec<u32> = (0..4).map(|i| images.read(i, &mut pixels).unwrap()).collect();
    assert_eq!(classes, [0, 0, 1, 1], "ant's two images, then cat's");
    // The last image (cat/b.png, 20x10) comes back 12x12 and still red: R plane high, B plane low.
    let (red, blue) = (&pixels[..144], &pixels[288..]);
    assert!(
        red.iter().all(|&v| v > 190) && blue.iter().all(|&v| v < 20),
        "{pixels:?}"
    );
    // Served as a data set: [n, 3, 12, 12] floats and the classes.
    let normalize = Normalize::new(&[0.5; 3], &[0.5; 3]);
    let data = ImageClassification::new(Arc::new(images), Augment::NONE, normalize, 0).unwrap();
    let batch = data.get_batch(&[0, 3]).unwrap();
    assert_eq!(batch.fields[0].shape.dims(), &[2, 3, 12, 12]);
}

#[test]
fn an_unreadable_image_is_an_error_naming_it_or_is_skipped_when_asked() {
    let root = folder("bad");
    let bad = root.join("cat/broken.png");
    std::fs::write(&bad, b"\x89PNG but not really").unwrap();
    let (images, _) = ImageFolder::open(&root, 8, false).unwrap();
    let mut pixels = vec![0u8; 3 * 8 * 8];
    let index = (0..images.len())
        .find(|&i| images.read(i, &mut pixels).is_err())
        .expect("the broken file fails");
    let err = images.read(index, &mut pixels).unwrap_err().to_string();
    assert!(err.contains("broken.png") && err.contains("--skip-bad-images"), "{err}");

    let (images, warnings) = ImageFolder::open(&root, 8, true).unwrap();
    assert_eq!(images.len(), 4);
    assert!(
        warnings.len() == 1 && warnings[0].contains("broken.png"),
        "{warnings:?}"
    );
    assert!((0..4).all(|i| images.read(i, &mut pixels).is_ok()));
}

#[test]
fn a_folder_without_class_folders_of_images_is_an_error_saying_what_is_expected() {
    let root = scratch("empty");
    std::fs::create_dir_all(root.join("cat")).unwrap();
    let err = ImageFolder::open(&root, 8, false).err().unwrap().to_string();
    assert!(
        err.contains("no images found") && err.contains("one subdirectory per class"),
        "{err}"
    );
    let err = ImageFolder::open(root.join("missing"), 8, false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("missing"), "{err}");
}
