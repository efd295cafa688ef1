//! unary, binary, bias_act and its gradient, compare and where_cond (elementwise.cu).

use cudarc::driver::LaunchConfig;
use lockstep_core::backend::{
    BackendBuffer, BiasGeometry, BinaryOp, BufferRef, CmpOp, UnaryOp, check_one_shape, mixed,
};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use super::op_index;
use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::entry_points;
use crate::gpu::launch;
use crate::views::{strided, to_u32};

/// The two parameters a unary op carries (`p0`, `p1` in the kernels).
fn unary_params(op: UnaryOp) -> (f32, f32) {
    match op {
        UnaryOp::Powf(e) | UnaryOp::ClampMin(e) | UnaryOp::ClampMax(e) => (e as f32, 0.0),
        UnaryOp::Affine { mul, add } => (mul as f32, add as f32),
        _ => (0.0, 0.0),
    }
}

fn unary_index(op: UnaryOp) -> u32 {
    op_index(&UnaryOp::ALL, UnaryOp::name, op.name())
}

impl CudaBackend {
    pub(crate) fn map(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        let name = op.name();
        let s = self.operand(name, src, Some(layout))?;
        let entry = entry_points::UNARY.of(name, s.dtype())?;
        let out = self.output(s.dtype(), layout.elem_count())?;
        let (shape, views) = strided(name, &[layout])?;
        let (p0, p1) = unary_params(op);
        if shape.n > 0 {
            launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
                &out.ptr, &s.ptr, &shape, &views[0], &unary_index(op), &p0, &p1);
        }
        Ok(out)
    }

    /// The operands of a binary op: this device, one dtype, one (broadcast) shape.
    fn pair<'a>(
        &self,
        op: &'static str,
        lhs: &'a BufferRef,
        ll: &Layout,
        rhs: &'a BufferRef,
        rl: &Layout,
    ) -> Result<(&'a CudaBuffer, &'a CudaBuffer)> {
        let (a, b) = (self.operand(op, lhs, Some(ll))?, self.operand(op, rhs, Some(rl))?);
        self.same_dtype(op, a, b)?;
        check_one_shape(op, ll, rl)?;
        Ok((a, b))
    }

    pub(crate) fn zip(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
    ) -> Result<BufferRef> {
        let name = op.name();
        let (a, b) = self.pair(name, lhs, ll, rhs, rl)?;
        let entry = entry_points::BINARY.of(name, a.dtype())?;
        let out = self.output(a.dtype(), ll.elem_count())?;
        let (shape, views) = strided(name, &[ll, rl])?;
        let index = op_index(&BinaryOp::ALL, BinaryOp::name, name);
        if shape.n > 0 {
            launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
                &out.ptr, &a.ptr, &b.ptr, &shape, &views[0], &views[1], &index);
        }
        Ok(out)
    }

    /// `Backend::binary_mixed`: an f32 operand and a half one in one launch, the half one read
    /// as it is; other pairs composed (a cast, then `zip`).
    pub(crate) fn zip_mixed(
        &self,
        op: BinaryOp,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
    ) -> Result<BufferRef> {
        let name = op.name();
        let Some((narrow_first, [(wide, wl), (narrow, nl)])) = mixed::f32_and_half((lhs, ll), (rhs, rl)) else {
            return mixed::binary_mixed(self, op, lhs, ll, rhs, rl);
        };
        let (w, n) = (
            self.operand(name, wide, Some(wl))?,
            self.operand(name, narrow, Some(nl))?,
        );
        check_one_shape(name, ll, rl)?;
        let entry = entry_points::BINARY_MIXED.of(name, n.dtype())?;
        let out = self.output(DType::F32, wl.elem_count())?;
        let (shape, views) = strided(name, &[wl, nl])?;
        let (index, narrow_lhs) = (op_index(&BinaryOp::ALL, BinaryOp::name, name), u32::from(narrow_first));
        if shape.n > 0 {
            launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
                &out.ptr, &w.ptr, &n.ptr, &shape, &views[0], &views[1], &index, &narrow_lhs);
        }
        Ok(out)
    }

    pub(crate) fn add_bias(
        &self,
        src: &BufferRef,
        bias: &BufferRef,
        g: BiasGeometry,
        act: Option<UnaryOp>,
    ) -> Result<BufferRef> {
        const OP: &str = "bias_act";
        let (s, b, sizes) = self.bias_operands(OP, src, bias, g)?;
        let entry = entry_points::BIAS_ACT.of(OP, s.dtype())?;
        let out = self.output(s.dtype(), g.len())?;
        let (act_index, (p0, p1)) = match act {
            Some(a) => (unary_index(a), unary_params(a)),
            None => (u32::MAX, (0.0, 0.0)),
        };
        if !g.is_empty() {
            let [n, channels, inner] = sizes;
            launch!(&self.gpu, entry, self.bias_grid(g);
                &out.ptr, &s.ptr, &b.ptr, &n, &channels, &inner, &act_index, &p0, &p1);
        }
        Ok(out)
    }

    /// `grad * derivative(src + bias)`, rounded after each step as the composed ops round.
    pub(crate) fn bias_act_gradient(
        &self,
        grad: &BufferRef,
        src: &BufferRef,
        bias: &BufferRef,
        g: BiasGeometry,
        derivative: UnaryOp,
    ) -> Result<BufferRef> {
        const OP: &str = "bias_act_grad";
        let (s, b, sizes) = self.bias_operands(OP, src, bias, g)?;
        let dy = self.operand(OP, grad, None)?;
        g.check_gradient(OP, (dy.len(), dy.dtype()), s.dtype())?;
        let entry = entry_points::BIAS_ACT_GRAD.of(OP, s.dtype())?;
        let out = self.output(s.dtype(), g.len())?;
        let (p0, p1) = unary_params(derivative);
        if !g.is_empty() {
            let [n, channels, inner] = sizes;
            launch!(&self.gpu, entry, self.bias_grid(g);
                &out.ptr, &dy.ptr, &s.ptr, &b.ptr, &n, &channels, &inner, &unary_index(derivative), &p0, &p1);
        }
        Ok(out)
    }

    /// The grid of a bias kernel (`for_each_biased` in elementwise.cu): rows of the channels of
    /// one outer index where `inner` is 1, else rows of one channel's `inner` elements.
    fn bias_grid(&self, g: BiasGeometry) -> LaunchConfig {
        match g.inner.max(1) {
            1 => self.gpu.rows_grid(g.outer, g.channels),
            inner => self.gpu.rows_grid(g.outer * g.channels, inner),
        }
    }

    /// The input and the bias of a bias op (this device, one dtype, holding `g`'s view) and the
    /// kernels' sizes `[n, channels, inner]`.
    fn bias_operands<'a>(
        &self,
        op: &'static str,
        src: &'a BufferRef,
        bias: &'a BufferRef,
        g: BiasGeometry,
    ) -> Result<(&'a CudaBuffer, &'a CudaBuffer, [u32; 3])> {
        let s = self.operand(op, src, Some(&Layout::contiguous([g.len()])))?;
        let b = self.operand(op, bias, Some(&Layout::contiguous([g.channels])))?;
        self.same_dtype(op, s, b)?;
        let sizes = [
            to_u32(op, g.len())?,
            to_u32(op, g.channels)?,
            to_u32(op, g.inner.max(1))?,
        ];
        Ok((s, b, sizes))
    }

    pub(crate) fn cmp(
        &self,
        op: CmpOp,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
    ) -> Result<BufferRef> {
        let name = op.name();
        let (a, b) = self.pair(name, lhs, ll, rhs, rl)?;
        let entry = entry_points::COMPARE.of(name, a.dtype())?;
        let out = self.output(DType::U32, ll.elem_count())?;
        let (shape, views) = strided(name, &[ll, rl])?;
        let index = op_index(&CmpOp::ALL, CmpOp::name, name);
        if shape.n > 0 {
            launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
                &out.ptr, &a.ptr, &b.ptr, &shape, &views[0], &views[1], &index);
        }
        Ok(out)
    }

    pub(crate) fn select(
        &self,
        cond: &BufferRef,
        cl: &Layout,
        on_true: &BufferRef,
        tl: &Layout,
        on_false: &BufferRef,
        fl: &Layout,
    ) -> Result<BufferRef> {
        const OP: &str = "where_cond";
        let c = self.operand(OP, cond, Some(cl))?;
        if c.dtype() != DType::U32 {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: c.dtype(),
                hint: "; the condition is a u32 mask",
            });
        }
        let (t, f) = self.pair(OP, on_true, tl, on_false, fl)?;
        if cl.shape != tl.shape {
            return Err(Error::shape(OP, &cl.shape, &tl.shape, "condition and values differ"));
        }
        let entry = entry_points::WHERE_COND.of(OP, t.dtype())?;
        let out = self.output(t.dtype(), tl.elem_count())?;
        let (shape, views) = strided(OP, &[cl, tl, fl])?;
        if shape.n > 0 {
            launch!(&self.gpu, entry, self.gpu.grid(shape.n as usize);
                &out.ptr, &c.ptr, &t.ptr, &f.ptr, &shape, &views[0], &views[1], &views[2]);
        }
        Ok(out)
    }
}
