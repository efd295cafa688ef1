//! `lockstep train --download`: fetches the MNIST files or the CIFAR archive missing from the
//! data directory from a mirror, each streamed to a temporary file beside its target, checked,
//! then renamed into place, so an interrupted or bad download never leaves a file that looks
//! complete.
//!
//! MNIST's check is the SHA-256 of the decompressed IDX contents, not of the `.gz` bytes:
//! faithful mirrors (and our own copies) recompress the same files, so gzip bytes differ between
//! good copies while the contents do not. A corrupt download fails the gzip CRC or the hash.
//! CIFAR's is the MD5 its authors publish for the archive itself, which is read unpacked.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lockstep_core::data::{cifar, mnist};
use md5::Md5;
use sha2::{Digest, Sha256};

/// The mirror torchvision uses; it serves the four original gzipped files.
pub const DEFAULT_BASE_URL: &str = "https://ossci-datasets.s3.amazonaws.com/mnist/";

/// SHA-256 of each standard file's uncompressed IDX contents (their MD5s match the published ones).
pub const CONTENT_SHA256: [(&str, &str); 4] = [
    (
        "train-images-idx3-ubyte",
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    (
        "train-labels-idx1-ubyte",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    (
        "t10k-images-idx3-ubyte",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    (
        "t10k-labels-idx1-ubyte",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
];

/// The largest file is 47 MB uncompressed; refuse a mirror that sends far more than that.
const MAX_BYTES: u64 = 128 << 20;

/// Where the CIFAR authors publish the binary archives.
pub const CIFAR_BASE_URL: &str = "https://www.cs.toronto.edu/~kriz/";

/// Each archive's MD5, as published on <https://www.cs.toronto.edu/~kriz/cifar.html>.
pub fn cifar_md5(kind: cifar::Kind) -> &'static str {
    match kind {
        cifar::Kind::Cifar10 => "c32a1d4ab5d03f1284b67883e8d87530",
        cifar::Kind::Cifar100 => "03b5dce01913d631647c71ecec9e9cb8",
    }
}

/// The archives are 170 MB; refuse a mirror that sends far more than that.
const MAX_ARCHIVE_BYTES: u64 = 256 << 20;

/// Downloads each file of `expected` (name, content SHA-256) that is not in `dir` (raw or
/// gzipped) from `base_url`/name.gz. Returns the paths written.
pub fn fetch_missing(
    dir: &Path,
    base_url: &str,
    expected: &[(&str, &str)],
    show_progress: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    // Refused up front: ureq's own error for a bare word ("http: invalid format") says little.
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        bail!("--download-url {base_url} is not an http:// or https:// URL");
    }
    let missing: Vec<_> = expected
        .iter()
        .filter(|(name, _)| mnist::locate(dir, name).is_err())
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let agent = agent();
    let mut written = Vec::new();
    for (name, sha256) in missing {
        let file = format!("{name}.gz");
        let url = join_url(base_url, &file);
        let target = dir.join(&file);
        eprintln_whole!("downloading {url}");
        let fetch = Fetch {
            url: &url,
            target: &target,
            max_bytes: MAX_BYTES,
            what: "any MNIST file",
        };
        fetch.run(&agent, show_progress, |tmp| {
            let actual = content_sha256(tmp).with_context(|| {
                format!("{url} is not valid gzip data (corrupt download, or not an MNIST file); the partial file was removed")
            })?;
            if actual != *sha256 {
                bail!(
                    "{name}.gz from {url} failed its SHA-256 check: expected {sha256}, got {actual} (corrupt download, or the mirror serves other files); the file was removed"
                );
            }
            Ok(())
        })?;
        written.push(target);
    }
    Ok(written)
}

/// Downloads `kind`'s published archive into `dir` from `base_url` unless `dir` already holds
/// the data set (its folder, batch files or archive); checks it against `md5` (the published
/// one, see [`cifar_md5`]). Returns the archive's path when it downloaded it.
pub fn fetch_cifar(
    dir: &Path,
    base_url: &str,
    kind: cifar::Kind,
    md5: &str,
    show_progress: bool,
) -> anyhow::Result<Option<PathBuf>> {
    if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
        bail!("--download-url {base_url} is not an http:// or https:// URL");
    }
    if cifar::locate(dir, kind).is_some() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let url = join_url(base_url, kind.archive());
    let target = dir.join(kind.archive());
    eprintln_whole!("downloading {url}");
    let fetch = Fetch {
        url: &url,
        target: &target,
        max_bytes: MAX_ARCHIVE_BYTES,
        what: "the CIFAR archives",
    };
    fetch.run(&agent(), show_progress, |tmp| {
        let actual = file_md5(tmp).with_context(|| format!("cannot read back {}", tmp.display()))?;
        if actual != md5 {
            bail!(
                "{} from {url} failed its MD5 check: expected {md5} (published), got {actual} (corrupt download, or the mirror serves another file); the file was removed",
                kind.archive()
            );
        }
        Ok(())
    })?;
    Ok(Some(target))
}

fn agent() -> ureq::Agent {
    // No global timeout (a slow link may need minutes for 10 MB); a stalled one must still end.
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("lockstep/", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::new_with_config(config)
}

pub fn join_url(base: &str, file: &str) -> String {
    format!("{}/{file}", base.trim_end_matches('/'))
}

/// Removes the temporary file on every early return; `persist` renames it into place instead.
struct TempFile(PathBuf);

impl TempFile {
    fn persist(mut self, target: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.0, target)?;
        self.0 = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// One file to stream from `url` into `target`, at most `max_bytes` long (`what` names the
/// largest file expected, for the error).
struct Fetch<'a> {
    url: &'a str,
    target: &'a Path,
    max_bytes: u64,
    what: &'a str,
}

impl Fetch<'_> {
    /// Streams the body into a temporary file beside the target, runs `verify` on it, then
    /// renames it into place; any failure removes the temporary file.
    fn run(
        &self,
        agent: &ureq::Agent,
        show_progress: bool,
        verify: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let (url, target) = (self.url, self.target);
        // The caller adds the ways out (another mirror, a local copy).
        let response = agent.get(url).call().map_err(|e| match e {
            ureq::Error::StatusCode(code) => anyhow::anyhow!("{url}: the server answered HTTP {code}"),
            other => anyhow::anyhow!("{url}: {other}"),
        })?;
        let length = response.body().content_length();
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = TempFile(target.with_file_name(format!(".{name}.part-{}", std::process::id())));
        let bar = progress_bar(length, &name, show_progress);
        let mut out = File::create(&tmp.0).with_context(|| format!("cannot write {}", tmp.0.display()))?;
        let mut body = response.into_body().into_reader().take(self.max_bytes + 1);
        let mut buf = vec![0u8; 64 << 10];
        let mut received = 0u64;
        loop {
            let n = body
                .read(&mut buf)
                .with_context(|| format!("download of {url} broke off after {received} bytes; run again to retry"))?;
            if n == 0 {
                break;
            }
            received += n as u64;
            if received > self.max_bytes {
                bail!(
                    "{url} sent more than {} bytes, far more than {}: not the file we asked for; check --download-url",
                    self.max_bytes,
                    self.what
                );
            }
            out.write_all(&buf[..n])
                .with_context(|| format!("cannot write {}", tmp.0.display()))?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
        if let Some(len) = length.filter(|&len| len != received) {
            bail!("download of {url} ended after {received} of {len} bytes; run again to retry");
        }
        out.sync_all()
            .with_context(|| format!("cannot write {}", tmp.0.display()))?;
        drop(out);
        verify(&tmp.0)?;
        tmp.persist(target)
            .with_context(|| format!("cannot move the download into place at {}", target.display()))
    }
}

fn progress_bar(length: Option<u64>, name: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(length, ProgressDrawTarget::stderr());
    let template = "{msg} {bar:32.cyan/blue} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})";
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar.set_message(name.to_string());
    bar
}

/// MD5 of a file's bytes, as published checksums give it.
pub fn file_md5(path: &Path) -> std::io::Result<String> {
    digest::<Md5>(BufReader::new(File::open(path)?))
}

/// SHA-256 of a file's contents, inflated first when it starts with the gzip magic bytes
/// (the same rule the MNIST reader applies).
pub fn content_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = BufReader::new(File::open(path)?);
    let mut magic = [0u8; 2];
    let gz = file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b];
    let file = BufReader::new(File::open(path)?);
    if gz {
        digest::<Sha256>(flate2::read::MultiGzDecoder::new(file))
    } else {
        digest::<Sha256>(file)
    }
}

/// The digest `D` of everything `reader` yields, as lower-case hex.
fn digest<D: Digest>(mut reader: impl Read) -> std::io::Result<String> {
    let mut hasher = D::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_with_one_slash() {
        assert_eq!(join_url("http://h/mnist/", "a.gz"), "http://h/mnist/a.gz");
        assert_eq!(join_url("http://h/mnist", "a.gz"), "http://h/mnist/a.gz");
    }

    #[test]
    fn the_table_covers_every_mnist_file() {
        let names: Vec<_> = CONTENT_SHA256.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, mnist::FILES);
        assert!(
            CONTENT_SHA256
                .iter()
                .all(|(_, h)| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        );
    }

    #[test]
    fn file_md5_is_the_published_digest() -> anyhow::Result<()> {
        let path = std::env::temp_dir().join(format!("lockstep-md5-{}", std::process::id()));
        std::fs::write(&path, b"abc")?;
        // RFC 1321's test suite: MD5("abc").
        assert_eq!(file_md5(&path)?, "900150983cd24fb0d6963f7d28e17f72");
        std::fs::remove_file(&path)?;
        Ok(())
    }

    #[test]
    fn gzipped_and_raw_contents_hash_alike() -> anyhow::Result<()> {
        let dir = std::env::temp_dir().join(format!("lockstep-sha-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let raw = dir.join("raw");
        std::fs::write(&raw, b"abc")?;
        let gz = dir.join("gz");
        let mut enc = flate2::write::GzEncoder::new(File::create(&gz)?, flate2::Compression::default());
        enc.write_all(b"abc")?;
        enc.finish()?;
        // The published SHA-256 of "abc".
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(content_sha256(&raw)?, abc);
        assert_eq!(content_sha256(&gz)?, abc);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
