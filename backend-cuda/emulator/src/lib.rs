//! The CUDA driver, cuBLAS and NCCL on the CPU, so `lockstep-cuda`'s tests run where no GPU is.
//!
//! `install` loads four shared libraries built from `cpp/` (the driver API, cuBLAS's strided
//! GEMM, an empty cuBLASLt, NCCL's communicators and collectives) whose SONAMEs are the names
//! cudarc asks dlopen for, so every later `dlopen("libcuda.so")` in the process answers with
//! the emulator. There are `LOCKSTEP_CUDA_EMULATOR_DEVICES` devices (2 by default), each with
//! `LOCKSTEP_CUDA_EMULATOR_MEMORY` bytes (8 GiB by default). NCCL's ranks may be threads of one
//! process or processes of one machine (they meet in shared memory); a collective returns once
//! every rank has called it, or fails after `LOCKSTEP_CUDA_EMULATOR_NCCL_TIMEOUT` seconds (300). The kernels are the real
//! `kernels/cuda/*.cu`, compiled as C++: each CUDA thread is a fiber, barriers and warp
//! shuffles switch fibers, `mma.sync` and `ldmatrix` follow the PTX ISA's fragment layouts.
//! To make kernel bugs show: fresh device memory is all NaN, each buffer ends at an inaccessible
//! page, and odd blocks run their threads in reverse order.
//! NVRTC still compiles every kernel (the backend loads a CUBIN first), so it must be present.
//!
//! What it checks: the backend's host code (launch shapes, parameters, views, memory, the
//! self-checks at start-up) and the kernels' logic and rounding. What it cannot: timing, races
//! between streams (every call runs when it is queued), code generation, libdevice's exact
//! last bits, or tensor-core accumulation order.

use std::sync::OnceLock;

/// Where the built libraries are.
pub const LIB_DIR: &str = env!("LOCKSTEP_CUDA_EMULATOR_LIB");

/// Loads the emulator into this process (once); an error says why it cannot (no C++ compiler
/// at build time, or a library that does not load). Call before anything opens a CUDA device:
/// a real driver loaded first stays the one cudarc uses.
pub fn install() -> Result<(), String> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED.get_or_init(load).clone()
}

/// Ok when the build made the libraries in `LIB_DIR`; else why it could not (e.g. no C++
/// compiler), for a test's skip message.
pub fn built() -> Result<(), String> {
    match env!("LOCKSTEP_CUDA_EMULATOR_BUILD_ERROR") {
        "" => Ok(()),
        why => Err(format!("the CUDA emulator was not built: {why}")),
    }
}

/// Elsewhere the build made nothing (build.rs): `built` says why.
#[cfg(not(unix))]
fn load() -> Result<(), String> {
    built()
}

#[cfg(unix)]
fn load() -> Result<(), String> {
    use std::ffi::CString;
    built()?;
    for name in ["libcuda.so", "libcublas.so", "libcublasLt.so", "libnccl.so"] {
        let path = format!("{LIB_DIR}/{name}");
        let c_path = CString::new(path.clone()).map_err(|e| e.to_string())?;
        // SAFETY: `c_path` is a NUL-terminated path; the handle is never closed (the library
        // stays loaded for the life of the process, as cudarc's own handles do).
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message owned by libc, read at once.
            let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
            return Err(format!("could not load {path}: {}", why.to_string_lossy()));
        }
    }
    Ok(())
}
