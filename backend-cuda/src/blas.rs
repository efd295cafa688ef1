//! cuBLAS on the compute stream: row-major batched products mapped onto column-major
//! `cublasGemmStridedBatchedEx`, f32 (TF32 only when asked for) and f16/bf16 with f32
//! accumulation.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::cublas::{result, sys};
use cudarc::driver::CudaStream;

use lockstep_core::{DType, Error, Result};

use crate::error::cublas_error;

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 products use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation): about
/// 4x the f32 throughput of an H100 at the precision PyTorch's `allow_tf32` gives. Off by
/// default; `LOCKSTEP_TF32=1` turns it on for a whole run.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::Relaxed) || std::env::var("LOCKSTEP_TF32").as_deref() == Ok("1")
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
        // SAFETY: `handle` was just created; the stream outlives it (both belong to the Gpu).
        unsafe { result::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| cublas_error(location, "binding cuBLAS to the stream", e))?;
        Ok(Blas {
            handle: Mutex::new(Handle(handle)),
        })
    }

    pub(crate) fn gemm(&self, location: &str, dtype: DType, g: &Gemm) -> Result<()> {
        let (data_type, compute) = match dtype {
            DType::F32 if allow_tf32() => (
                sys::cudaDataType::CUDA_R_32F,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            DType::F32 => (
                sys::cudaDataType::CUDA_R_32F,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::F16 => (
                sys::cudaDataType::CUDA_R_16F,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::BF16 => (
                sys::cudaDataType::CUDA_R_16BF,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            other => return Err(Error::dtype("matmul", other)),
        };
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
