//! CIFAR files in the published binary format, written by the tests (no copy of CIFAR is on
//! these machines): records of label byte(s) then 3072 pixel bytes, as loose batch files or as
//! the published `.tar.gz`. Each image is tinted by its class (so a model can learn them) with
//! a position- and record-dependent grain on top.
//!
//! Included by each crate's tests with `#[path]`; needs the `flate2` and `tar` crates.

use std::io::Write;
use std::path::Path;

use lockstep_core::data::cifar::{Kind, PIXELS, Split};

/// Record `i` of batch file number `f` (in the order train files, then test files).
pub fn record(kind: Kind, f: usize, i: usize) -> Vec<u8> {
    let class = (f * 7 + i * 3) % kind.classes();
    let mut r = match kind {
        Kind::Cifar10 => vec![class as u8],
        Kind::Cifar100 => vec![(class / 5) as u8, class as u8],
    };
    r.extend((0..PIXELS).map(|p| {
        let tint = (class * 23 + (p / 1024) * 71) % 200;
        let grain = (p * 31 + i * 17 + f * 101) % 48;
        (tint + grain) as u8
    }));
    r
}

/// Every batch file of `kind` with `per_file` records each, as (name, bytes).
pub fn batch_files(kind: Kind, per_file: usize) -> Vec<(String, Vec<u8>)> {
    let names = kind.files(Split::Train).iter().chain(kind.files(Split::Test));
    names
        .enumerate()
        .map(|(f, name)| {
            (
                name.to_string(),
                (0..per_file).flat_map(|i| record(kind, f, i)).collect(),
            )
        })
        .collect()
}

/// Writes `files` into `dir`.
pub fn write_dir(dir: &Path, files: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The published layout: a gzipped tar of `<folder>/<batch files>` and a readme.
pub fn write_archive(path: &Path, kind: Kind, files: &[(String, Vec<u8>)]) {
    let gz = flate2::write::GzEncoder::new(std::fs::File::create(path).unwrap(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let mut add = |name: String, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes).unwrap();
    };
    add(format!("{}/readme.html", kind.folder()), b"<html></html>");
    for (name, bytes) in files {
        add(format!("{}/{name}", kind.folder()), bytes);
    }
    tar.into_inner().unwrap().finish().unwrap().flush().unwrap();
}
