//! A plan run on the element type's kernels: f32 and f64 through `fused`, bf16 through
//! `fused_bf16` where the plan has the bf16 kernel's paths, and 16-bit floats the plan widens
//! through `fused` on f32 copies (the same products, exact in f32, summed in f32 and rounded
//! once).

use super::{Plan, fused};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::float;
use crate::backend::cpu::pool::Pool;
use crate::dtype::HostVec;

/// `weight [o, c·kh·kw] @ im2col(x)` as `[o, n·oh·ow]`, as `plan` says; `None` for element
/// types (or a mix) that are not convolved.
pub fn forward(pool: &Pool, x: &HostVec, w: &HostVec, g: &Conv2dGeometry, o: usize, plan: &Plan) -> Option<HostVec> {
    Some(match (x, w) {
        (HostVec::F32(x), HostVec::F32(w)) => HostVec::F32(fused::forward(pool, x, w, g, o, plan)),
        (HostVec::F64(x), HostVec::F64(w)) => HostVec::F64(fused::forward(pool, x, w, g, o, plan)),
        #[cfg(target_arch = "x86_64")]
        (HostVec::BF16(x), HostVec::BF16(w)) if !plan.widened => {
            HostVec::BF16(super::fused_bf16::forward(pool, x, w, g, o, plan))
        }
        (HostVec::BF16(x), HostVec::BF16(w)) => HostVec::BF16(float::through_f32(
            pool,
            [x, w],
            float::widen_bf16,
            float::narrow_bf16,
            |[x, w]| fused::forward(pool, x, w, g, o, plan),
        )),
        (HostVec::F16(x), HostVec::F16(w)) => HostVec::F16(float::through_f32(
            pool,
            [x, w],
            float::widen_f16,
            float::narrow_f16,
            |[x, w]| fused::forward(pool, x, w, g, o, plan),
        )),
        _ => return None,
    })
}

/// The input's and the weight's gradients from `grad` `[o, n·oh·ow]`, as `plan` says; `None`
/// for element types (or a mix) that are not convolved.
pub fn backward(
    pool: &Pool,
    x: &HostVec,
    w: &HostVec,
    grad: &HostVec,
    g: &Conv2dGeometry,
    o: usize,
    plan: &Plan,
) -> Option<(HostVec, HostVec)> {
    Some(match (x, w, grad) {
        (HostVec::F32(x), HostVec::F32(w), HostVec::F32(d)) => {
            let (gx, gw) = fused::backward(pool, x, w, d, g, o, plan);
            (HostVec::F32(gx), HostVec::F32(gw))
        }
        (HostVec::F64(x), HostVec::F64(w), HostVec::F64(d)) => {
            let (gx, gw) = fused::backward(pool, x, w, d, g, o, plan);
            (HostVec::F64(gx), HostVec::F64(gw))
        }
        #[cfg(target_arch = "x86_64")]
        (HostVec::BF16(x), HostVec::BF16(w), HostVec::BF16(d)) if !plan.widened => {
            let (gx, gw) = super::fused_bf16::backward(pool, x, w, d, g, o, plan);
            (HostVec::BF16(gx), HostVec::BF16(gw))
        }
        (HostVec::BF16(x), HostVec::BF16(w), HostVec::BF16(d)) => {
            let [gx, gw] =
                float::through_f32_outputs(pool, [x, w, d], float::widen_bf16, float::narrow_bf16, |[x, w, d]| {
                    fused::backward(pool, x, w, d, g, o, plan).into()
                });
            (HostVec::BF16(gx), HostVec::BF16(gw))
        }
        (HostVec::F16(x), HostVec::F16(w), HostVec::F16(d)) => {
            let [gx, gw] =
                float::through_f32_outputs(pool, [x, w, d], float::widen_f16, float::narrow_f16, |[x, w, d]| {
                    fused::backward(pool, x, w, d, g, o, plan).into()
                });
            (HostVec::F16(gx), HostVec::F16(gw))
        }
        _ => return None,
    })
}
