//! Compiled kernels on disk, keyed by the program's hash, the architecture and NVRTC's version:
//! a process compiles each file once per machine, not once per run. Writes go to a temporary
//! file renamed into place, so concurrent processes never read half a CUBIN; a cache that
//! cannot be written only costs a compile.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::KernelSource;
use crate::compile::{CompileError, compile, nvrtc_version};

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
    let program = kernel.program();
    let (major, minor) = nvrtc_version()?;
    let hash = Sha256::digest(program.as_bytes());
    let key: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
    let file = cache_dir().map(|d| d.join(format!("{}-{arch}-nvrtc{major}.{minor}-{key}.cubin", kernel.name)));
    if let Some(bytes) = file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .filter(|b| !b.is_empty())
    {
        return Ok(bytes);
    }
    let cubin = compile(kernel.name, &program, arch)?;
    if let Some(file) = file {
        store(&file, &cubin);
    }
    Ok(cubin)
}

fn store(file: &std::path::Path, bytes: &[u8]) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(
        ".{}.{}",
        std::process::id(),
        file.file_name().unwrap_or_default().to_string_lossy()
    ));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
