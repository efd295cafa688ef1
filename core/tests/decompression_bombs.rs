//! Small gzipped files that inflate to half a gigabyte, posing as MNIST's IDX files and CIFAR's
//! archive, are refused once they inflate past what their format allows, never inflated in full:
//! this test binary's heap is capped well below what the bombs inflate to, so a reader that
//! inflated one whole would abort the test.

use std::alloc::System;
use std::io::{Read, Write};

use cap::Cap;
use flate2::Compression;
use flate2::write::GzEncoder;
use lockstep_core::data::cifar::{Cifar, Kind, Split};
use lockstep_core::data::mnist::Mnist;

/// What each bomb inflates to.
const INFLATED: u64 = 512 << 20;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, 192 << 20);

/// `head` then zeros up to `INFLATED` bytes, gzipped (about 500 KiB: deflate at its best is about 1000:1).
fn gzip_bomb(head: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(head).unwrap();
    std::io::copy(&mut std::io::repeat(0).take(INFLATED - head.len() as u64), &mut gz).unwrap();
    gz.finish().unwrap()
}

#[test]
fn an_idx_file_that_inflates_past_its_header_is_refused() {
    // Ten 28x28 images declared: 7840 bytes of data, then half a gigabyte more.
    let mut header = vec![0, 0, 8, 3];
    for d in [10u32, 28, 28] {
        header.extend(d.to_be_bytes());
    }
    let bomb = gzip_bomb(&header);
    assert!(bomb.len() < 2 << 20, "{} bytes", bomb.len());
    let labels = vec![0, 0, 8, 1, 0, 0, 0, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    let err = Mnist::from_bytes(("bomb-images.gz", bomb), ("labels", labels))
        .err()
        .expect("a bomb was read as MNIST")
        .to_string();
    assert!(
        err.contains("bomb-images.gz") && err.contains("inflates past the 7840 bytes of data its header declares"),
        "{err}"
    );
}

#[test]
fn a_cifar_archive_whose_batch_file_inflates_past_the_format_is_refused() {
    let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::best()));
    let mut header = tar::Header::new_gnu();
    header.set_size(INFLATED);
    header.set_mode(0o644);
    header.set_cksum();
    let zeros = std::io::repeat(0).take(INFLATED);
    tar.append_data(&mut header, "cifar-10-batches-bin/test_batch.bin", zeros)
        .unwrap();
    let bomb = tar.into_inner().unwrap().finish().unwrap();
    assert!(bomb.len() < 2 << 20, "{} bytes", bomb.len());
    let dir = std::env::temp_dir().join(format!("lockstep-bomb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let archive = dir.join("cifar-10-binary.tar.gz");
    std::fs::write(&archive, bomb).unwrap();
    let err = Cifar::load(&archive, Kind::Cifar10, Split::Test)
        .err()
        .expect("a bomb was read as CIFAR-10")
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    let most = Kind::Cifar10.file_bytes("test_batch.bin").unwrap();
    assert_eq!(most, 10_000 * 3073);
    assert!(
        err.contains("test_batch.bin") && err.contains(&format!("more than the {most} bytes of a CIFAR-10 batch file")),
        "{err}"
    );
}
