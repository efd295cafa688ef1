//! cuDNN convolutions on the compute stream: NCHW in and out, so a convolution needs neither
//! unfolded columns (9x its input for a 3x3 kernel) nor a permute of the product, the path
//! PyTorch takes. Optional: without libcudnn.so.9, or for a geometry cuDNN has no deterministic
//! algorithm for, the backend answers `None` and the caller unfolds (im2col + cuBLAS).
//!
//! Only deterministic algorithms are taken (PyTorch's `cudnn.deterministic`): the same inputs
//! give the same bits on every run, which exact resume relies on (`LOCKSTEP_CUDNN_DETERMINISTIC=0`
//! trades that for cuDNN's full choice). f32 convolutions use FMA math
//! (no TF32) unless TF32 is allowed, as for cuBLAS.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cudnn::{result, sys};
use cudarc::driver::CudaStream;

use lockstep_core::backend::Conv2dGeometry;
use lockstep_core::{DType, Error, Result};

/// Workspaces above this are not worth their memory: a smaller algorithm is taken instead.
const MAX_WORKSPACE: usize = 1 << 30;

/// Whether libcudnn loads (a dlopen of its candidate names; nothing is called).
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the candidate names of libcudnn.
    unsafe { sys::is_culib_present() }
}

/// `LOCKSTEP_CUDNN=0` turns cuDNN off (the unfolding path, to compare or to work around it).
fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("LOCKSTEP_CUDNN").as_deref() != Ok("0") && present())
}

/// `LOCKSTEP_CUDNN_DETERMINISTIC=0` also admits cuDNN's non-deterministic algorithms (PyTorch's
/// default, `cudnn.deterministic = False`): maybe faster, but a run is no longer bit-exact, so an
/// exact resume can diverge from the uninterrupted run. Read once, at the first plan.
pub fn deterministic_only() -> bool {
    static DETERMINISTIC: OnceLock<bool> = OnceLock::new();
    *DETERMINISTIC.get_or_init(|| std::env::var("LOCKSTEP_CUDNN_DETERMINISTIC").as_deref() != Ok("0"))
}

fn dnn_error(device: &str, what: &str, e: result::CudnnError) -> Error {
    Error::Device {
        device: device.into(),
        msg: format!("{what}: cuDNN {:?}", e.0),
    }
}

/// The three pointers of one convolution call: input, filter and output (their gradients in
/// the backward calls), each a live device allocation of the plan's shape.
#[derive(Clone, Copy)]
pub(crate) struct Pointers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
}

/// Which product of a convolution: `y = conv(x, w)`, `dx` from `dy` and `w`, `dw` from `x` and `dy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Forward,
    InputGradient,
    WeightGradient,
}

pub(crate) struct Dnn {
    location: String,
    handle: Mutex<Handle>,
    plans: Mutex<HashMap<(Conv2dGeometry, usize, DType), Arc<Plan>>>,
}

struct Handle(sys::cudnnHandle_t);
// SAFETY: a cuDNN handle may move between threads; the mutex keeps calls on it one at a time.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `create_handle` and is destroyed once, here.
        let _ = unsafe { result::destroy_handle(self.0) };
    }
}

impl Dnn {
    /// A handle bound to `stream`, or `None` where cuDNN is absent or turned off.
    pub(crate) fn open(location: &str, stream: &CudaStream) -> Result<Option<Dnn>> {
        if !enabled() {
            return Ok(None);
        }
        let handle = result::create_handle().map_err(|e| dnn_error(location, "creating the cuDNN handle", e))?;
        let dnn = Dnn {
            location: location.into(),
            handle: Mutex::new(Handle(handle)),
            plans: Mutex::default(),
        };
        // SAFETY: `handle` was just created; the stream outlives it (both belong to the Gpu).
        unsafe { result::set_stream(handle, stream.cu_stream() as _) }
            .map_err(|e| dnn_error(location, "binding cuDNN to the stream", e))?;
        Ok(Some(dnn))
    }

    /// Queues one product of the convolution `geom` with `o` output channels; `Ok(false)` when
    /// cuDNN has no deterministic algorithm for it (nothing queued). `workspace` allocates the
    /// bytes asked for (its pointer, and what keeps it alive until the call is queued; the free
    /// is stream-ordered after it).
    pub(crate) fn run<W>(
        &self,
        direction: Direction,
        (geom, o, dtype): (&Conv2dGeometry, usize, DType),
        p: Pointers,
        workspace: impl FnOnce(usize) -> Result<(u64, W)>,
    ) -> Result<bool> {
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        let plan = self.plan(handle.0, geom, o, dtype)?;
        let Some(choice) = plan.choice(direction) else {
            return Ok(false);
        };
        let (work, _keep) = match choice.workspace {
            0 => (0, None),
            bytes => {
                let (ptr, keep) = workspace(bytes)?;
                (ptr, Some(keep))
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (alpha, beta) = (
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
        );
        let ptr = |p: u64| p as *mut c_void;
        // SAFETY: the descriptors are live (owned by `plan`) and describe the buffers behind
        // `p`, which the caller keeps alive until the queued call has run (stream order), as
        // the workspace (`_keep`); alpha and beta are f32, the scaling type of f32, f16 and
        // bf16 data; the handle is locked for the whole call.
        let status = unsafe {
            result::set_convolution_math_type(plan.conv.0, choice.math).and_then(|()| match choice.algo {
                Algo::Forward(algo) => result::convolution_forward(
                    handle.0,
                    alpha,
                    plan.x.0,
                    ptr(p.x),
                    plan.w.0,
                    ptr(p.w),
                    plan.conv.0,
                    algo,
                    ptr(work),
                    choice.workspace,
                    beta,
                    plan.y.0,
                    ptr(p.y),
                ),
                Algo::Data(algo) => result::convolution_backward_data(
                    handle.0,
                    alpha,
                    plan.w.0,
                    ptr(p.w),
                    plan.y.0,
                    ptr(p.y),
                    plan.conv.0,
                    algo,
                    ptr(work),
                    choice.workspace,
                    beta,
                    plan.x.0,
                    ptr(p.x),
                ),
                Algo::Filter(algo) => result::convolution_backward_filter(
                    handle.0,
                    alpha,
                    plan.x.0,
                    ptr(p.x),
                    plan.y.0,
                    ptr(p.y),
                    plan.conv.0,
                    algo,
                    ptr(work),
                    choice.workspace,
                    beta,
                    plan.w.0,
                    ptr(p.w),
                ),
            })
        };
        status.map_err(|e| dnn_error(&self.location, &format!("convolution ({direction:?})"), e))?;
        Ok(true)
    }

    /// The descriptors and algorithms of one geometry, made on first use.
    fn plan(&self, handle: sys::cudnnHandle_t, geom: &Conv2dGeometry, o: usize, dtype: DType) -> Result<Arc<Plan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(plan) = plans.get(&(*geom, o, dtype)) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(
            Plan::new(handle, geom, o, dtype).map_err(|e| dnn_error(&self.location, "planning a convolution", e))?,
        );
        plans.insert((*geom, o, dtype), plan.clone());
        Ok(plan)
    }
}

/// One direction's algorithm, its math type and its workspace in bytes.
#[derive(Clone, Copy)]
struct Choice {
    algo: Algo,
    math: sys::cudnnMathType_t,
    workspace: usize,
}

#[derive(Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

struct Plan {
    x: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    y: TensorDesc,
    forward: Option<Choice>,
    data: Option<Choice>,
    filter: Option<Choice>,
}

impl Plan {
    fn new(
        handle: sys::cudnnHandle_t,
        g: &Conv2dGeometry,
        o: usize,
        dtype: DType,
    ) -> std::result::Result<Plan, result::CudnnError> {
        use sys::cudnnDataType_t::{CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT, CUDNN_DATA_HALF};
        use sys::cudnnMathType_t::{CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH};
        let (stored, math) = match dtype {
            DType::F32 if crate::blas::allow_tf32() => (CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH),
            DType::F32 => (CUDNN_DATA_FLOAT, CUDNN_FMA_MATH),
            DType::F16 => (CUDNN_DATA_HALF, CUDNN_TENSOR_OP_MATH),
            _ => (CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH),
        };
        let int = |v: usize| v as std::ffi::c_int;
        let x = TensorDesc::new(stored, [g.n, g.c, g.h, g.w].map(int))?;
        let y = TensorDesc::new(stored, [g.n, o, g.out_h(), g.out_w()].map(int))?;
        let w = FilterDesc::new(stored, [o, g.c, g.kh, g.kw].map(int))?;
        let conv = ConvDesc::new(g, math)?;
        // f32 without TF32 takes FMA algorithms only; the half types take any.
        let allowed = |m: sys::cudnnMathType_t| dtype != DType::F32 || m == math || math == CUDNN_DEFAULT_MATH;
        let (xd, wd, cd, yd) = (x.0, w.0, conv.0, y.0);
        // SAFETY (each query): cuDNN fills at most `n` perf structs at `perf` and reads the live
        // descriptors above.
        let forward = best(
            FWD,
            |n, returned, perf| unsafe {
                result::get_convolution_forward_algorithm(handle, xd, wd, cd, yd, n, returned, perf)
            },
            |p: &sys::cudnnConvolutionFwdAlgoPerf_t| {
                (Algo::Forward(p.algo), p.status, p.determinism, p.memory, p.mathType)
            },
            &allowed,
        )?;
        let data = best(
            DATA,
            |n, returned, perf| unsafe {
                result::get_convolution_backward_data_algorithm(handle, wd, yd, cd, xd, n, returned, perf)
            },
            |p: &sys::cudnnConvolutionBwdDataAlgoPerf_t| {
                (Algo::Data(p.algo), p.status, p.determinism, p.memory, p.mathType)
            },
            &allowed,
        )?;
        let filter = best(
            FILTER,
            |n, returned, perf| unsafe {
                result::get_convolution_backward_filter_algorithm(handle, xd, yd, cd, wd, n, returned, perf)
            },
            |p: &sys::cudnnConvolutionBwdFilterAlgoPerf_t| {
                (Algo::Filter(p.algo), p.status, p.determinism, p.memory, p.mathType)
            },
            &allowed,
        )?;
        Ok(Plan {
            x,
            w,
            conv,
            y,
            forward,
            data,
            filter,
        })
    }

    fn choice(&self, direction: Direction) -> Option<Choice> {
        match direction {
            Direction::Forward => self.forward,
            Direction::InputGradient => self.data,
            Direction::WeightGradient => self.filter,
        }
    }
}

const FWD: usize = sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT as usize;
const DATA: usize = sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT as usize;
const FILTER: usize = sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT as usize;

/// A candidate algorithm as the heuristics describe it.
type Candidate = (
    Algo,
    sys::cudnnStatus_t,
    sys::cudnnDeterminism_t,
    usize,
    sys::cudnnMathType_t,
);

/// One direction's heuristic query (`query(n, returned, perf)` fills up to `n` perf structs,
/// best first), and `first`'s pick of them.
fn best<P: Copy>(
    count: usize,
    query: impl FnOnce(std::ffi::c_int, *mut std::ffi::c_int, *mut P) -> std::result::Result<(), result::CudnnError>,
    candidate: impl Fn(&P) -> Candidate,
    allowed: &impl Fn(sys::cudnnMathType_t) -> bool,
) -> std::result::Result<Option<Choice>, result::CudnnError> {
    // SAFETY: cuDNN's perf structs are plain C data, for which all zeros is a valid value.
    let mut perf = vec![unsafe { std::mem::zeroed::<P>() }; count];
    let mut returned = 0;
    query(count as std::ffi::c_int, &mut returned, perf.as_mut_ptr())?;
    let returned = (returned.max(0) as usize).min(count);
    Ok(first(perf[..returned].iter().map(candidate), allowed))
}

/// The heuristics' best (they come best first) working candidate of an allowed math type and a
/// workspace within `MAX_WORKSPACE`, deterministic unless `deterministic_only` says otherwise.
fn first(
    candidates: impl Iterator<Item = Candidate>,
    allowed: &impl Fn(sys::cudnnMathType_t) -> bool,
) -> Option<Choice> {
    candidates
        .filter(|&(_, status, determinism, memory, math)| {
            status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                && (determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC || !deterministic_only())
                && memory <= MAX_WORKSPACE
                && allowed(math)
        })
        .map(|(algo, _, _, workspace, math)| Choice { algo, math, workspace })
        .next()
}

struct TensorDesc(sys::cudnnTensorDescriptor_t);
struct FilterDesc(sys::cudnnFilterDescriptor_t);
struct ConvDesc(sys::cudnnConvolutionDescriptor_t);
// SAFETY: descriptors are host-side parameter blocks; a plan's are written once, when it is
// made, and afterwards only read by calls made under the handle's mutex (the math type is set
// under it too).
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl TensorDesc {
    fn new(data: sys::cudnnDataType_t, dims: [std::ffi::c_int; 4]) -> std::result::Result<Self, result::CudnnError> {
        let desc = TensorDesc(result::create_tensor_descriptor()?);
        // SAFETY: `desc` was just created.
        unsafe { result::set_tensor4d_descriptor(desc.0, sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, data, dims) }?;
        Ok(desc)
    }
}

impl FilterDesc {
    fn new(data: sys::cudnnDataType_t, dims: [std::ffi::c_int; 4]) -> std::result::Result<Self, result::CudnnError> {
        let desc = FilterDesc(result::create_filter_descriptor()?);
        // SAFETY: `desc` was just created.
        unsafe { result::set_filter4d_descriptor(desc.0, data, sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, dims) }?;
        Ok(desc)
    }
}

impl ConvDesc {
    fn new(g: &Conv2dGeometry, math: sys::cudnnMathType_t) -> std::result::Result<Self, result::CudnnError> {
        let desc = ConvDesc(result::create_convolution_descriptor()?);
        let int = |v: usize| v as std::ffi::c_int;
        // SAFETY: `desc` was just created; cross-correlation (PyTorch's convolution) with an
        // f32 compute type for every data type.
        unsafe {
            result::set_convolution2d_descriptor(
                desc.0,
                int(g.padding[0]),
                int(g.padding[1]),
                int(g.stride[0]),
                int(g.stride[1]),
                int(g.dilation[0]),
                int(g.dilation[1]),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )?;
            result::set_convolution_math_type(desc.0, math)?;
        }
        Ok(desc)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `create_tensor_descriptor`, destroyed once, here.
        let _ = unsafe { result::destroy_tensor_descriptor(self.0) };
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `create_filter_descriptor`, destroyed once, here.
        let _ = unsafe { result::destroy_filter_descriptor(self.0) };
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `create_convolution_descriptor`, destroyed once, here.
        let _ = unsafe { result::destroy_convolution_descriptor(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudnnConvolutionFwdAlgo_t::{
        CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
    };
    use sys::cudnnDeterminism_t::{CUDNN_DETERMINISTIC, CUDNN_NON_DETERMINISTIC};
    use sys::cudnnMathType_t::{CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH};
    use sys::cudnnStatus_t::{CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_SUCCESS};

    fn algo(c: &Option<Choice>) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
        c.map(|c| match c.algo {
            Algo::Forward(a) => a,
            _ => panic!("a forward query chose another direction's algorithm"),
        })
    }

    #[test]
    fn the_first_working_deterministic_candidate_within_the_workspace_limit_wins() {
        let any = |_| true;
        let candidates = [
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_FFT),
                CUDNN_STATUS_NOT_SUPPORTED,
                CUDNN_DETERMINISTIC,
                0,
                CUDNN_TENSOR_OP_MATH,
            ),
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
                CUDNN_STATUS_SUCCESS,
                CUDNN_NON_DETERMINISTIC,
                0,
                CUDNN_TENSOR_OP_MATH,
            ),
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD),
                CUDNN_STATUS_SUCCESS,
                CUDNN_DETERMINISTIC,
                MAX_WORKSPACE + 1,
                CUDNN_TENSOR_OP_MATH,
            ),
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM),
                CUDNN_STATUS_SUCCESS,
                CUDNN_DETERMINISTIC,
                4096,
                CUDNN_TENSOR_OP_MATH,
            ),
        ];
        let chosen = first(candidates.into_iter(), &any);
        assert_eq!(algo(&chosen), Some(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM));
        assert_eq!(chosen.unwrap().workspace, 4096);
        // None fits: the caller unfolds instead.
        assert!(first(candidates[..3].iter().copied(), &any).is_none());
    }

    #[test]
    fn f32_without_tf32_takes_fma_algorithms_only() {
        let fma_only = |m| m == CUDNN_FMA_MATH;
        let candidates = [
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM),
                CUDNN_STATUS_SUCCESS,
                CUDNN_DETERMINISTIC,
                0,
                CUDNN_TENSOR_OP_MATH,
            ),
            (
                Algo::Forward(CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
                CUDNN_STATUS_SUCCESS,
                CUDNN_DETERMINISTIC,
                0,
                CUDNN_FMA_MATH,
            ),
        ];
        let chosen = first(candidates.into_iter(), &fma_only);
        assert_eq!(algo(&chosen), Some(CUDNN_CONVOLUTION_FWD_ALGO_GEMM));
        assert_eq!(chosen.unwrap().math, CUDNN_FMA_MATH);
    }
}
