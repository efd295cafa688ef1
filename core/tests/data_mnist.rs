use std::path::Path;

mod data_support;
use data_support::{full_mnist, mnist_dir};
mod scratch_support;
use scratch_support::Scratch;

use lockstep_core::HostVec;
use lockstep_core::data::Dataset;
use lockstep_core::data::mnist::{Mnist, Split};

#[test]
fn the_full_test_set_has_the_published_label_counts() {
    let Some(dir) = full_mnist("the published label counts") else {
        return;
    };
    let test = Mnist::load(dir, Split::Test).unwrap();
    assert_eq!(test.len(), 10_000);
    let mut counts = [0usize; 10];
    (0..test.len()).for_each(|i| counts[test.label(i).unwrap() as usize] += 1);
    assert_eq!(counts, [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]);
}

#[test]
fn reads_the_real_images_and_labels() {
    let test = Mnist::load(mnist_dir(), Split::Test).unwrap();
    assert_eq!(test.image_shape(), [1, 28, 28]);
    let batch = test.get_batch(&[0, 1]).unwrap();
    assert_eq!(batch.fields[0].shape.dims(), &[2, 1, 28, 28]);
    // Test sample 0 is a 7, sample 1 a 2; the corner pixel is background: (0 - 0.1307) / 0.3081.
    assert_eq!(batch.fields[1].data, HostVec::U32(vec![7, 2]));
    let HostVec::F32(px) = &batch.fields[0].data else {
        panic!("f32 images")
    };
    assert!((px[0] - (-0.1307 / 0.3081)).abs() < 1e-6);
    let max = px.iter().cloned().fold(f32::MIN, f32::max);
    assert!((max - (1.0 - 0.1307) / 0.3081).abs() < 1e-5, "{max}");
}

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("mnist-{name}"))
}

/// Writes raw (un-gzipped) test-split files: `images` and `labels` bytes as given.
fn write_split(dir: &std::path::Path, images: &[u8], labels: &[u8]) {
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), images).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte"), labels).unwrap();
}

fn idx(magic: u32, dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    dims.iter().for_each(|d| v.extend(d.to_be_bytes()));
    v.extend_from_slice(payload);
    v
}

fn load_err(dir: &Path) -> String {
    Mnist::load(dir, Split::Test).err().expect("an error").to_string()
}

#[test]
fn bad_files_get_errors_that_say_what_is_wrong() {
    let dir = scratch("missing");
    let err = load_err(&dir);
    assert!(
        err.contains("t10k-images-idx3-ubyte") && err.contains("not found"),
        "{err}"
    );

    let dir = scratch("truncated");
    write_split(&dir, &idx(0x803, &[2, 2, 2], &[0; 5]), &idx(0x801, &[2], &[1, 2]));
    let err = load_err(&dir);
    assert!(err.contains("truncated") && err.contains("[2, 2, 2]"), "{err}");

    let dir = scratch("magic");
    write_split(&dir, &idx(0x801, &[2, 2, 2], &[0; 8]), &idx(0x801, &[2], &[1, 2]));
    assert!(load_err(&dir).contains("magic number"));

    let dir = scratch("mismatch");
    write_split(&dir, &idx(0x803, &[2, 2, 2], &[0; 8]), &idx(0x801, &[3], &[1, 2, 3]));
    assert!(load_err(&dir).contains("2 images but 3 labels"));

    let dir = scratch("label");
    write_split(&dir, &idx(0x803, &[2, 2, 2], &[0; 8]), &idx(0x801, &[2], &[1, 12]));
    assert!(load_err(&dir).contains("label 12 at index 1"));

    let dir = scratch("gzip");
    let real = std::fs::read(mnist_dir().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    std::fs::write(dir.join("t10k-labels-idx1-ubyte.gz"), &real[..real.len() / 2]).unwrap();
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), idx(0x803, &[2, 2, 2], &[0; 8])).unwrap();
    let err = load_err(&dir);
    assert!(err.contains("gzip"), "{err}");
}
