//! unary, binary, compare and where_cond over strided operands of one shape.

use lockstep_core::backend::{BinaryOp, BufferRef, CmpOp, UnaryOp, check_one_shape, mixed};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use super::{op_index, strided_params};
use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::pipelines::Variant;

/// The two parameters a unary op carries (`p0`, `p1` in the shaders).
pub(crate) fn unary_params(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Powf(e) | UnaryOp::ClampMin(e) | UnaryOp::ClampMax(e) => (e, 0.0),
        UnaryOp::Affine { mul, add } => (mul, add),
        _ => (0.0, 0.0),
    }
}

impl WgpuBackend {
    pub(crate) fn map(&self, op: UnaryOp, src: &BufferRef, layout: &Layout) -> Result<BufferRef> {
        let name = op.name();
        let src = self.operand(name, src, Some(layout))?;
        let t = self.element_type(name, src.dtype())?;
        let (p0, p1) = unary_params(op);
        let mut params = strided_params(name, &[layout])?;
        params.extend([(p0 as f32).to_bits(), (p1 as f32).to_bits()]);
        let out = self.alloc("unary", src.dtype(), layout.elem_count())?;
        let variant = Variant::new("unary", "unary", &[t]).constant("OP", op_index(&UnaryOp::ALL, UnaryOp::name, name));
        self.launch(
            &variant,
            &params,
            &[(1, src), (2, &out)],
            self.word_grid(name, src.dtype(), layout.elem_count())?,
        )?;
        Ok(out)
    }

    /// The operands of a binary op: same device kind, same dtype, same (broadcast) shape.
    fn pair<'a>(
        &self,
        op: &'static str,
        lhs: &'a BufferRef,
        lhs_layout: &Layout,
        rhs: &'a BufferRef,
        rhs_layout: &Layout,
    ) -> Result<(&'a WgpuBuffer, &'a WgpuBuffer)> {
        let (a, b) = (
            self.operand(op, lhs, Some(lhs_layout))?,
            self.operand(op, rhs, Some(rhs_layout))?,
        );
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        check_one_shape(op, lhs_layout, rhs_layout)?;
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
        let t = self.element_type(name, a.dtype())?;
        let out = self.alloc("binary", a.dtype(), ll.elem_count())?;
        let variant =
            Variant::new("binary", "binary", &[t]).constant("OP", op_index(&BinaryOp::ALL, BinaryOp::name, name));
        self.launch(
            &variant,
            &strided_params(name, &[ll, rl])?,
            &[(1, a), (2, b), (3, &out)],
            self.word_grid(name, a.dtype(), ll.elem_count())?,
        )?;
        Ok(out)
    }

    /// `Backend::binary_mixed`: an f32 operand and a 16-bit one in one dispatch, the 16-bit one
    /// read as it is; other pairs composed (a cast, then `zip`).
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
        let out = self.alloc("binary_mixed", DType::F32, wl.elem_count())?;
        let variant = Variant::new("binary_mixed", "binary_mixed", &[self.element_type(name, n.dtype())?])
            .constant("OP", op_index(&BinaryOp::ALL, BinaryOp::name, name))
            .constant("NARROW_FIRST", if narrow_first { 1.0 } else { 0.0 });
        self.launch(
            &variant,
            &strided_params(name, &[wl, nl])?,
            &[(1, w), (2, n), (3, &out)],
            self.word_grid(name, DType::F32, wl.elem_count())?,
        )?;
        Ok(out)
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
        // i64 operands bind as (low, high) word pairs at their own bindings.
        let (t, entry, bindings) = match a.dtype() {
            DType::I64 => ("u32", "compare_i64", [4, 5]),
            d => (self.value_type(name, d)?, "compare", [1, 2]),
        };
        let out = self.alloc("compare", DType::U32, ll.elem_count())?;
        let variant = Variant::new("compare", entry, &[t]).constant("OP", op_index(&CmpOp::ALL, CmpOp::name, name));
        self.launch(
            &variant,
            &strided_params(name, &[ll, rl])?,
            &[(bindings[0], a), (bindings[1], b), (3, &out)],
            self.grid(name, ll.elem_count())?,
        )?;
        Ok(out)
    }

    pub(crate) fn select(
        &self,
        cond: &BufferRef,
        cond_layout: &Layout,
        on_true: &BufferRef,
        true_layout: &Layout,
        on_false: &BufferRef,
        false_layout: &Layout,
    ) -> Result<BufferRef> {
        const OP: &str = "where_cond";
        let c = self.operand(OP, cond, Some(cond_layout))?;
        if c.dtype() != DType::U32 {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype: c.dtype(),
                hint: "; the condition is a u32 mask",
            });
        }
        let (t, f) = self.pair(OP, on_true, true_layout, on_false, false_layout)?;
        if cond_layout.shape != true_layout.shape {
            return Err(Error::shape(
                OP,
                &cond_layout.shape,
                &true_layout.shape,
                "condition and values differ",
            ));
        }
        let word = self.word_type(OP, t.dtype())?;
        let out = self.alloc("select", t.dtype(), true_layout.elem_count())?;
        self.launch(
            &Variant::new(OP, OP, &[word]),
            &strided_params(OP, &[cond_layout, true_layout, false_layout])?,
            &[(1, c), (2, t), (3, f), (4, &out)],
            self.grid(OP, true_layout.elem_count())?,
        )?;
        Ok(out)
    }
}
