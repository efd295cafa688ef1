//! Which CUDA libraries this process can load, checked with dlopen before any call that would
//! otherwise panic inside cudarc (its loaders panic when a library is missing).

use lockstep_core::{Error, Result};

/// One library the backend uses, and whether it loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    pub name: &'static str,
    pub file: &'static str,
    pub present: bool,
    /// What to do when it is missing.
    pub remedy: &'static str,
}

/// The driver, NVRTC, cuBLAS, cuBLASLt, NCCL and cuDNN, each probed (a few ms in all).
pub fn libraries() -> Vec<Library> {
    // SAFETY (each call): `is_culib_present` only tries to dlopen the candidate library names.
    vec![
        Library {
            name: "CUDA driver",
            file: "libcuda.so.1",
            present: unsafe { cudarc::driver::sys::is_culib_present() },
            remedy: "install the NVIDIA driver (580 or newer for CUDA 13)",
        },
        Library {
            name: "NVRTC",
            file: "libnvrtc.so.13",
            present: lockstep_kernels::nvrtc_present(),
            remedy: "`pip install nvidia-cuda-nvrtc==13.0.*` (or the CUDA 13 toolkit) and put nvidia/cu13/lib on LD_LIBRARY_PATH",
        },
        Library {
            name: "cuBLAS",
            file: "libcublas.so.13",
            present: unsafe { cudarc::cublas::sys::is_culib_present() },
            remedy: "`pip install nvidia-cublas==13.0.*` (or the CUDA 13 toolkit) and put nvidia/cu13/lib on LD_LIBRARY_PATH",
        },
        Library {
            name: "cuBLASLt",
            file: "libcublasLt.so.13",
            present: unsafe { cudarc::cublaslt::sys::is_culib_present() },
            remedy: "comes with cuBLAS",
        },
        Library {
            name: "NCCL",
            file: "libnccl.so",
            present: nccl_present(),
            remedy: "`pip install nvidia-nccl-cu13`, then make a directory with a symlink libnccl.so -> \
                     .../nvidia/nccl/lib/libnccl.so.2 and put it on LD_LIBRARY_PATH (the wheel ships only libnccl.so.2)",
        },
        Library {
            name: "cuDNN",
            file: "libcudnn.so.9",
            present: crate::dnn::present(),
            remedy: "`pip install nvidia-cudnn-cu13` and put nvidia/cudnn/lib on LD_LIBRARY_PATH (optional: without \
                     it convolutions unfold through im2col and cuBLAS, slower)",
        },
    ]
}

pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the candidate names of libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen the candidate names of libnccl.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// Libraries a device works without: NCCL is only needed by collectives (and checked there),
/// cuDNN only speeds convolutions up.
const OPTIONAL: [&str; 2] = ["NCCL", "cuDNN"];

/// Ok when every library a device needs for tensor work loads (all but the `OPTIONAL` ones);
/// else an error naming each missing one and its remedy.
pub fn require_compute_libraries(device: &str) -> Result<()> {
    let missing: Vec<String> = libraries()
        .into_iter()
        .filter(|l| !l.present && !OPTIONAL.contains(&l.name))
        .map(|l| format!("{} library not found ({}): {}", l.name, l.file, l.remedy))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Device {
        device: device.into(),
        msg: missing.join("; "),
    })
}

/// The number of CUDA devices, or an error saying why there are none usable.
pub fn device_count() -> Result<usize> {
    // The kind is known here; what is missing is the driver, so the error says that.
    if !driver_present() {
        return Err(Error::Device {
            device: "cuda".into(),
            msg: "no CUDA driver found (libcuda.so.1): install the NVIDIA driver, or use `wgpu:0` or `cpu`".into(),
        });
    }
    cudarc::driver::CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| Error::Device {
            device: "cuda".into(),
            msg: format!("the CUDA driver loaded but reports no usable device ({e:?}); use `wgpu:0` or `cpu`"),
        })
}
