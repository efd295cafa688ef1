//! One NVRTC compilation: CUDA C to a CUBIN for one real architecture (`sm_90`), so the driver
//! loads machine code and never JIT-compiles PTX (a newer NVRTC's PTX can be refused by an
//! older driver; its CUBIN for a given architecture is not).

use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;

use cudarc::nvrtc::{result, sys};

/// Why a kernel did not compile: NVRTC missing, or the compiler's own log.
#[derive(Debug)]
pub enum CompileError {
    /// libnvrtc could not be loaded.
    NoNvrtc,
    /// NVRTC ran and refused the source; `log` is its message.
    Refused { kernel: String, arch: String, log: String },
    /// An NVRTC call failed outside compilation (out of memory, bad option).
    Nvrtc {
        kernel: String,
        call: &'static str,
        code: String,
    },
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::NoNvrtc => f.write_str(
                "NVRTC library not found (libnvrtc.so.13): install the CUDA 13 toolkit or `pip install \
                 nvidia-cuda-nvrtc==13.0.*` and put its nvidia/cu13/lib on LD_LIBRARY_PATH",
            ),
            CompileError::Refused { kernel, arch, log } => {
                write!(f, "NVRTC could not compile kernels/{kernel}.cu for {arch}:\n{log}")
            }
            CompileError::Nvrtc { kernel, call, code } => write!(f, "NVRTC {call} failed for {kernel}.cu: {code}"),
        }
    }
}

impl std::error::Error for CompileError {}

/// Whether libnvrtc can be loaded (a dlopen probe: never panics).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names; loads nothing else.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's (major, minor) version, part of the disk cache's key.
pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NoNvrtc);
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are to live locals NVRTC writes one int each into.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    status.result().map_err(|e| CompileError::Nvrtc {
        kernel: String::new(),
        call: "nvrtcVersion",
        code: format!("{e:?}"),
    })?;
    Ok((major, minor))
}

/// Compiles `source` (named `kernel` in messages) into a CUBIN for `arch` (`sm_80`, `sm_90`).
pub fn compile(kernel: &str, source: &str, arch: &str) -> Result<Vec<u8>, CompileError> {
    compile_logged(kernel, source, arch, &[]).map(|(cubin, _)| cubin)
}

/// `compile` with `extra` NVRTC options, returning the compiler's log beside the CUBIN (with
/// `--ptxas-options=-v`, each entry point's registers and stack frame).
pub(crate) fn compile_logged(
    kernel: &str,
    source: &str,
    arch: &str,
    extra: &[&str],
) -> Result<(Vec<u8>, String), CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NoNvrtc);
    }
    let failed = |call: &'static str| {
        move |e: result::NvrtcError| CompileError::Nvrtc {
            kernel: kernel.to_string(),
            call,
            code: format!("{e:?}"),
        }
    };
    let src = CString::new(source).map_err(|_| CompileError::Refused {
        kernel: kernel.into(),
        arch: arch.into(),
        log: "the source holds a NUL byte".into(),
    })?;
    let name = CString::new(format!("{kernel}.cu")).unwrap_or_default();
    let program = result::create_program(&src, Some(&name)).map_err(failed("nvrtcCreateProgram"))?;
    let mut options = compile_options(arch);
    options.extend(extra.iter().map(|o| o.to_string()));
    // SAFETY: `program` was just created and is destroyed below, once, on every path.
    let compiled = unsafe { result::compile_program(program, &options) };
    let outcome = match compiled {
        Ok(()) => cubin(program)
            .map(|c| (c, log(program)))
            .map_err(failed("nvrtcGetCUBIN")),
        Err(_) => Err(CompileError::Refused {
            kernel: kernel.into(),
            arch: arch.into(),
            log: log(program),
        }),
    };
    // SAFETY: created above and not destroyed before.
    let _ = unsafe { result::destroy_program(program) };
    outcome
}

/// NVRTC's options for `arch`. Part of the disk cache's key too: a changed option must not
/// reuse a CUBIN built with the old one.
pub(crate) fn compile_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Every kernel wants f32 denormals kept and IEEE division: results must match the CPU's.
        "--fmad=true".to_string(),
    ]
}

fn cubin(program: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: `program` compiled successfully; NVRTC writes the size, then exactly that many
    // bytes into a buffer of that size.
    unsafe {
        sys::nvrtcGetCUBINSize(program, &mut size).result()?;
        let mut bytes = vec![0u8; size];
        sys::nvrtcGetCUBIN(program, bytes.as_mut_ptr() as *mut c_char).result()?;
        Ok(bytes)
    }
}

fn log(program: sys::nvrtcProgram) -> String {
    // SAFETY: `program` is live; the log is a NUL-terminated string NVRTC owns a copy of.
    match unsafe { result::get_program_log(program) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
            CStr::from_bytes_until_nul(&bytes)
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}
