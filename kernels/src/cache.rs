//! Compiled kernels on disk, keyed by the program's and the compile options' hash, the
//! architecture and NVRTC's version: a process compiles each file once per machine, not once per
//! run. Writes go to a temporary file (unique per write) renamed into place, so concurrent
//! processes and threads never read half a CUBIN; a cached file that is not a whole CUBIN is
//! compiled again and replaced; a cache that cannot be written only costs a compile.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::KernelSource;
use crate::compile::{CompileError, compile, compile_options, nvrtc_version};
use crate::cubin::is_plausible_cubin;

/// `$LOCKSTEP_KERNEL_CACHE`, else `$XDG_CACHE_HOME/lockstep/kernels`, else
/// `~/.cache/lockstep/kernels`; None when none of them can be named.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("LOCKSTEP_KERNEL_CACHE") {
        return Some(dir.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("lockstep").join("kernels"))
}

/// The CUBIN of `kernel` for `arch`, from the disk cache or freshly compiled (and then cached).
pub fn compile_cached(kernel: &KernelSource, arch: &str) -> Result<Vec<u8>, CompileError> {
    compile_cached_in(cache_dir().as_deref(), kernel, arch)
}

/// `compile_cached` with the cache directory given (None: compile and keep nothing).
pub(crate) fn compile_cached_in(
    dir: Option<&Path>,
    kernel: &KernelSource,
    arch: &str,
) -> Result<Vec<u8>, CompileError> {
    let program = kernel.program();
    let file = dir.map(|d| cache_file(d, kernel, &program, arch)).transpose()?;
    cached_or_compiled(file.as_deref(), || compile(kernel.name, &program, arch))
}

/// Where the CUBIN of `kernel` (whose full source is `program`) for `arch` lives under `dir`.
pub(crate) fn cache_file(
    dir: &Path,
    kernel: &KernelSource,
    program: &str,
    arch: &str,
) -> Result<PathBuf, CompileError> {
    let (major, minor) = nvrtc_version()?;
    let key = cache_key(program, &compile_options(arch));
    Ok(dir.join(format!("{}-{arch}-nvrtc{major}.{minor}-{key}.cubin", kernel.name)))
}

/// 24 hex digits of SHA-256 over the program and every compile option, so neither a changed
/// kernel nor a changed option can reuse an old CUBIN.
pub(crate) fn cache_key(program: &str, options: &[String]) -> String {
    let mut hash = Sha256::new();
    hash.update(program.as_bytes());
    for option in options {
        // A NUL (in neither a source nor an option) keeps ["-a", "b"] apart from ["-ab"].
        hash.update([0u8]);
        hash.update(option.as_bytes());
    }
    hash.finalize()[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// The whole CUBIN at `file`, else the one `compile` makes, stored at `file` in place of
/// whatever was there.
fn cached_or_compiled(
    file: Option<&Path>,
    compile: impl FnOnce() -> Result<Vec<u8>, CompileError>,
) -> Result<Vec<u8>, CompileError> {
    if let Some(cubin) = file.and_then(read_whole_cubin) {
        return Ok(cubin);
    }
    let cubin = compile()?;
    if let Some(file) = file {
        // A cache that cannot be written only costs a compile next time.
        let _ = store(file, &cubin);
    }
    Ok(cubin)
}

/// The CUBIN at `file`, if it is there and whole (not truncated, zeroed or foreign).
fn read_whole_cubin(file: &Path) -> Option<Vec<u8>> {
    std::fs::read(file).ok().filter(|bytes| is_plausible_cubin(bytes))
}

/// Writes `bytes` to `file` through a temporary file renamed into place: a reader sees the old
/// file or the whole new one, never a part.
pub(crate) fn store(file: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = file
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no directory", file.display())))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(temporary_name(file));
    let stored = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, file));
    if stored.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    stored
}

/// A name no other write uses, in this process (threads of two GPUs may store the same kernel
/// at once) or another (the pid).
fn temporary_name(file: &Path) -> String {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = WRITES.fetch_add(1, Ordering::Relaxed);
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    format!(".{}.{write}.{name}.tmp", std::process::id())
}

#[cfg(test)]
mod tests;
