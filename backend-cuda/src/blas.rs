//! cuBLAS on the compute stream: row-major batched products mapped onto column-major
//! `cublasGemmStridedBatchedEx`, f32 (TF32 only when asked for) and f16/bf16 with f32
//! accumulation, reductions included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::{result, sys};
use cudarc::driver::CudaStream;

use lockstep_core::{DType, Error, Result};

use crate::error::cublas_error;

/// The handle's math mode: every product reduces in its f32 compute type. cuBLAS's default
/// lets split-K reductions of f16/bf16 products run in f16/bf16, losing the f32 accumulation
/// the CPU backend has. f32 outputs are unaffected, and TF32 is asked for per product through
/// its compute type (`gemm_types`), so the mode carries no TF32 flag.
const MATH_MODE: sys::cublasMath_t = sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;

/// A switch whose initial state comes from the environment, read once, on first use (not on
/// every product).
struct EnvSwitch(OnceLock<AtomicBool>);

impl EnvSwitch {
    const fn new() -> EnvSwitch {
        EnvSwitch(OnceLock::new())
    }

    fn state(&self, from_env: impl FnOnce() -> bool) -> &AtomicBool {
        self.0.get_or_init(|| AtomicBool::new(from_env()))
    }
}

static ALLOW_TF32: EnvSwitch = EnvSwitch::new();

fn tf32_from_env() -> bool {
    std::env::var("LOCKSTEP_TF32").as_deref() == Ok("1")
}

/// Lets f32 products use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation): about
/// 4x the f32 throughput of an H100 at the precision PyTorch's `allow_tf32` gives. Off by
/// default; `LOCKSTEP_TF32=1` turns it on for a whole run, and this overrides either.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.state(tf32_from_env).store(allow, Ordering::Relaxed);
}

pub fn allow_tf32() -> bool {
    ALLOW_TF32.state(tf32_from_env).load(Ordering::Relaxed)
}

/// cuBLAS's data and compute types for a product of `dtype` (f32 accumulation throughout;
/// TF32 inputs for f32 only when `tf32`).
fn gemm_types(dtype: DType, tf32: bool) -> Result<(sys::cudaDataType, sys::cublasComputeType_t)> {
    use sys::cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    use sys::cudaDataType::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
    match dtype {
        DType::F32 if tf32 => Ok((CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32)),
        DType::F32 => Ok((CUDA_R_32F, CUBLAS_COMPUTE_32F)),
        DType::F16 => Ok((CUDA_R_16F, CUBLAS_COMPUTE_32F)),
        DType::BF16 => Ok((CUDA_R_16BF, CUBLAS_COMPUTE_32F)),
        other => Err(Error::dtype("matmul", other)),
    }
}

pub(crate) struct Blas {
    handle: Mutex<Handle>,
}

struct Handle(sys::cublasHandle_t);
// SAFETY: a cuBLAS handle may move between threads; the mutex keeps calls on it one at a time.
unsafe impl Send for Handle {}

/// One column-major operand of a GEMM: pointer, transpose flag, leading dimension, batch stride.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub ptr: u64,
    pub transpose: bool,
    pub ld: i32,
    pub batch_stride: i64,
}

/// `C[b] (m x n, column-major, ld m) = op(A[b]) (m x k) * op(B[b]) (k x n)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub batch: i32,
    pub a: Operand,
    pub b: Operand,
    pub c: u64,
}

impl Blas {
    pub(crate) fn new(location: &str, stream: &CudaStream) -> Result<Blas> {
        let handle = result::create_handle().map_err(|e| cublas_error(location, "creating the cuBLAS handle", e))?;
        // Owned from here, so a failed setup below still destroys the handle (Drop).
        let blas = Blas {
            handle: Mutex::new(Handle(handle)),
        };
        // SAFETY: `handle` was just created; the stream outlives it (both belong to the Gpu).
        unsafe { result::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| cublas_error(location, "binding cuBLAS to the stream", e))?;
        // SAFETY: `handle` is live and `MATH_MODE` is one of cublasMath_t's values.
        unsafe { sys::cublasSetMathMode(handle, MATH_MODE) }
            .result()
            .map_err(|e| cublas_error(location, "setting cuBLAS's math mode", e))?;
        Ok(blas)
    }

    pub(crate) fn gemm(&self, location: &str, dtype: DType, g: &Gemm) -> Result<()> {
        let (data_type, compute) = gemm_types(dtype, allow_tf32())?;
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the caller checked that A, B and C hold `batch` matrices of the given shapes,
        // leading dimensions and batch strides; alpha and beta are f32, as the f32 compute type
        // wants; the handle is bound to the compute stream, which orders the product.
        unsafe {
            result::gemm_strided_batched_ex(
                handle.0,
                op(g.a.transpose),
                op(g.b.transpose),
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const _,
                g.a.ptr as *const _,
                data_type,
                g.a.ld,
                g.a.batch_stride,
                g.b.ptr as *const _,
                data_type,
                g.b.ld,
                g.b.batch_stride,
                &beta as *const f32 as *const _,
                g.c as *mut _,
                data_type,
                g.m,
                (g.m as i64) * (g.n as i64),
                g.batch,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| cublas_error(location, "matmul", e))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let handle = self.handle.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: created in `new`, destroyed once here.
        let _ = unsafe { result::destroy_handle(handle.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};

    #[test]
    fn the_handle_keeps_reductions_in_the_compute_type_and_nothing_else() {
        const DISALLOW_REDUCED_PRECISION_REDUCTION: u32 = 16;
        assert_eq!(MATH_MODE as u32, DISALLOW_REDUCED_PRECISION_REDUCTION);
    }

    #[test]
    fn half_precision_products_accumulate_in_f32_and_only_f32_may_use_tf32() {
        for tf32 in [false, true] {
            assert_eq!(gemm_types(DType::F16, tf32).map(|t| t.1).ok(), Some(CUBLAS_COMPUTE_32F));
            assert_eq!(
                gemm_types(DType::BF16, tf32).map(|t| t.1).ok(),
                Some(CUBLAS_COMPUTE_32F)
            );
        }
        assert_eq!(
            gemm_types(DType::F32, false).map(|t| t.1).ok(),
            Some(CUBLAS_COMPUTE_32F)
        );
        assert_eq!(
            gemm_types(DType::F32, true).map(|t| t.1).ok(),
            Some(CUBLAS_COMPUTE_32F_FAST_TF32)
        );
        assert!(gemm_types(DType::F64, true).is_err() && gemm_types(DType::I64, false).is_err());
    }

    #[test]
    fn the_environment_is_read_once_and_setting_overrides_it() {
        let switch = EnvSwitch::new();
        let mut reads = 0;
        for _ in 0..3 {
            let state = switch.state(|| {
                reads += 1;
                true
            });
            assert!(state.load(Ordering::Relaxed));
        }
        assert_eq!(reads, 1, "the environment was read on every use");
        switch.state(|| true).store(false, Ordering::Relaxed);
        assert!(
            !switch.state(|| true).load(Ordering::Relaxed),
            "setting did not override the environment"
        );
    }
}
