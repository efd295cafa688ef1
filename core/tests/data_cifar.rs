//! The CIFAR readers on files in the published binary format that the test writes (there is no
//! copy of CIFAR on these machines): the extracted folder and the .tar.gz read the same, CIFAR-100
//! takes its fine label, every malformed file is an error naming it and what was expected, and
//! augmented batches depend on (seed, epoch, index) only, whatever the number of loader workers.

use std::path::Path;
use std::sync::Arc;

use lockstep_core::HostVec;
use lockstep_core::data::augment::{Augment, Normalize};
use lockstep_core::data::cifar::{self, Cifar, Kind, Split};
use lockstep_core::data::{DataLoader, DataLoaderConfig, Dataset, ImageClassification, ImageSource};

#[path = "../../testdata/cifar.rs"]
mod cifar_files;

use cifar_files::{batch_files, record, write_archive, write_dir};

mod scratch_support;
use scratch_support::Scratch;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("cifar-{name}"))
}

fn image(source: &dyn ImageSource, i: usize) -> (Vec<u8>, u32) {
    let mut out = vec![0u8; cifar::PIXELS];
    let label = source.read(i, &mut out).unwrap();
    (out, label)
}

#[test]
fn cifar10_reads_the_same_from_its_folder_and_from_the_published_archive() {
    let files = batch_files(Kind::Cifar10, 3);
    let root = scratch("c10");
    write_dir(&root.join(Kind::Cifar10.folder()), &files);
    let archive_home = scratch("c10-archive");
    write_archive(&archive_home.join(Kind::Cifar10.archive()), Kind::Cifar10, &files);

    let sources = [
        Cifar::load(&root, Kind::Cifar10, Split::Train).unwrap(),
        Cifar::load(root.join(Kind::Cifar10.folder()), Kind::Cifar10, Split::Train).unwrap(),
        Cifar::load(&archive_home, Kind::Cifar10, Split::Train).unwrap(),
        Cifar::load(archive_home.join(Kind::Cifar10.archive()), Kind::Cifar10, Split::Train).unwrap(),
    ];
    for source in &sources {
        assert_eq!((source.len(), source.shape(), source.classes()), (15, [3, 32, 32], 10));
        // Image 4 is record 1 of data_batch_2.bin; image 14 is record 2 of data_batch_5.bin.
        for (i, f, r) in [(0, 0, 0), (4, 1, 1), (14, 4, 2)] {
            let expected = record(Kind::Cifar10, f, r);
            assert_eq!(image(source, i), (expected[1..].to_vec(), expected[0] as u32));
        }
    }
    let test = Cifar::load(&archive_home, Kind::Cifar10, Split::Test).unwrap();
    assert_eq!(test.len(), 3);
    assert_eq!(image(&test, 2).1, record(Kind::Cifar10, 5, 2)[0] as u32);
}

#[test]
fn cifar100_takes_the_fine_label_of_its_two() {
    let files = batch_files(Kind::Cifar100, 4);
    let home = scratch("c100");
    write_archive(&home.join(Kind::Cifar100.archive()), Kind::Cifar100, &files);
    let train = Cifar::load(&home, Kind::Cifar100, Split::Train).unwrap();
    assert_eq!((train.len(), train.classes()), (4, 100));
    let expected = record(Kind::Cifar100, 0, 3);
    assert_eq!(image(&train, 3), (expected[2..].to_vec(), expected[1] as u32));
}

#[test]
fn malformed_cifar_files_are_errors_naming_the_file_and_what_was_expected() {
    let files = batch_files(Kind::Cifar10, 2);
    let load = |dir: &Path| Cifar::load(dir, Kind::Cifar10, Split::Train).err().unwrap().to_string();

    let truncated = scratch("truncated");
    write_dir(&truncated, &files);
    let path = truncated.join("data_batch_3.bin");
    std::fs::write(&path, &files[2].1[..3073 + 100]).unwrap();
    let err = load(&truncated);
    assert!(
        err.contains("data_batch_3.bin") && err.contains("3073-byte") && err.contains("truncated"),
        "{err}"
    );

    let missing = scratch("missing");
    write_dir(&missing, &files);
    std::fs::remove_file(missing.join("data_batch_4.bin")).unwrap();
    let err = load(&missing);
    assert!(err.contains("data_batch_4.bin") && err.contains("missing"), "{err}");

    let bad_label = scratch("label");
    let mut files_with_bad_label = files.clone();
    files_with_bad_label[0].1[3073] = 10;
    write_dir(&bad_label, &files_with_bad_label);
    let err = load(&bad_label);
    assert!(
        err.contains("data_batch_1.bin") && err.contains("record 1 has class 10"),
        "{err}"
    );

    let nothing = scratch("nothing");
    let err = load(&nothing);
    assert!(
        err.contains("not found") && err.contains("cifar-10-binary.tar.gz"),
        "{err}"
    );

    let short_archive = scratch("short-archive");
    write_archive(&short_archive.join(Kind::Cifar10.archive()), Kind::Cifar10, &files[..3]);
    let err = load(&short_archive);
    assert!(
        err.contains("data_batch_4.bin") && err.contains("missing from the archive"),
        "{err}"
    );

    let corrupt = scratch("corrupt");
    let archive = corrupt.join(Kind::Cifar10.archive());
    write_archive(&archive, Kind::Cifar10, &files);
    let bytes = std::fs::read(&archive).unwrap();
    std::fs::write(&archive, &bytes[..bytes.len() / 2]).unwrap();
    let err = load(&corrupt);
    assert!(
        err.contains("cifar-10-binary.tar.gz") && err.contains("download it again"),
        "{err}"
    );
}

fn images_of(batch: &lockstep_core::data::Batch) -> Vec<f32> {
    match &batch.fields[0].data {
        HostVec::F32(v) => v.clone(),
        other => panic!("images are {:?}", other.dtype()),
    }
}

#[test]
fn augmented_batches_depend_on_seed_epoch_and_index_not_on_workers() {
    let home = scratch("augment");
    write_dir(&home, &batch_files(Kind::Cifar10, 8));
    let source: Arc<dyn ImageSource> = Arc::new(Cifar::load(&home, Kind::Cifar10, Split::Train).unwrap());
    let (mean, std) = Kind::Cifar10.mean_std();
    let dataset =
        |augment| Arc::new(ImageClassification::new(source.clone(), augment, Normalize::new(&mean, &std), 5).unwrap());

    // Without augmentation a pixel is (byte/255 - mean)/std of its channel.
    let plain = dataset(Augment::NONE).get_batch_at(3, &[9]).unwrap();
    let (bytes, label) = image(source.as_ref(), 9);
    let expected: Vec<f32> = bytes
        .iter()
        .enumerate()
        .map(|(p, &b)| (b as f32 / 255.0 - mean[p / 1024]) / std[p / 1024])
        .collect();
    assert_eq!(images_of(&plain), expected);
    assert_eq!(plain.fields[1].data, HostVec::U32(vec![label]));

    let augmented = dataset(Augment::CIFAR);
    let epoch_batches = |workers: usize, epoch: u64| -> Vec<Vec<f32>> {
        let config = DataLoaderConfig {
            batch_size: 8,
            num_workers: workers,
            ..DataLoaderConfig::default()
        };
        let loader = DataLoader::simple(augmented.clone(), true, 1, config).unwrap();
        loader.iter(epoch).map(|b| images_of(&b.unwrap())).collect()
    };
    let reference = epoch_batches(0, 2);
    assert_eq!(reference.len(), 5);
    assert_eq!(epoch_batches(2, 2), reference);
    assert_eq!(epoch_batches(4, 2), reference);
    assert_ne!(
        epoch_batches(0, 3),
        reference,
        "another epoch crops and flips differently"
    );
    let first = images_of(&augmented.get_batch_at(2, &[9]).unwrap());
    assert_ne!(first, expected, "the crop or flip changes the image");
    // Every augmented value is a normalised byte or the padding (byte 0).
    let zero: Vec<f32> = (0..3).map(|c| -mean[c] / std[c]).collect();
    let padded = first.iter().enumerate().filter(|(p, v)| **v == zero[p / 1024]).count();
    assert!(padded < cifar::PIXELS / 4, "{padded} padding pixels");
}
