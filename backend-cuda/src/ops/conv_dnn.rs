//! Convolutions by cuDNN (dnn.rs), NCHW in and out: the backend's `conv2d_nchw` and its
//! gradients, where cuDNN is there and takes the operands.

use std::sync::Arc;

use lockstep_core::backend::{BackendBuffer, BufferRef, Conv2dGeometry};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Result};

use crate::backend::CudaBackend;
use crate::buffer::CudaBuffer;
use crate::dnn::{Direction, Dnn, Pointers};

/// The three tensors of a convolution, by their extents.
#[derive(Clone, Copy)]
enum Image {
    Input,
    Weight,
    Output,
}

impl Image {
    fn len(self, g: &Conv2dGeometry, o: usize) -> usize {
        match self {
            Image::Input => g.n * g.c * g.h * g.w,
            Image::Weight => o * g.c * g.kh * g.kw,
            Image::Output => g.n * o * g.out_h() * g.out_w(),
        }
    }
}

impl CudaBackend {
    /// `[n, o, oh, ow]` by cuDNN, or `None`: no cuDNN, a dtype it does not take, or no
    /// deterministic algorithm for the geometry.
    pub(crate) fn conv2d_dnn(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        g: &Conv2dGeometry,
        o: usize,
    ) -> Result<Option<BufferRef>> {
        const OP: &str = "conv2d";
        let Some((dnn, [x, weight], dtype)) =
            self.dnn_operands(OP, g, o, [(x, Image::Input), (weight, Image::Weight)])?
        else {
            return Ok(None);
        };
        let y = self.output(dtype, Image::Output.len(g, o))?;
        let pointers = Pointers {
            x: x.ptr,
            w: weight.ptr,
            y: y.ptr,
        };
        let queued = self.gpu.timed("cudnn conv forward", || {
            dnn.run(Direction::Forward, (g, o, dtype), pointers, |bytes| {
                self.workspace(bytes)
            })
        })?;
        Ok(queued.then_some(y as BufferRef))
    }

    /// The input's and the weight's gradients by cuDNN from `grad` `[n, o, oh, ow]`, or `None`
    /// as for `conv2d_dnn`.
    pub(crate) fn conv2d_dnn_backward(
        &self,
        [x, weight, grad]: [&BufferRef; 3],
        g: &Conv2dGeometry,
        o: usize,
    ) -> Result<Option<(BufferRef, BufferRef)>> {
        const OP: &str = "conv2d_backward";
        let operands = [(x, Image::Input), (weight, Image::Weight), (grad, Image::Output)];
        let Some((dnn, [x, weight, grad], dtype)) = self.dnn_operands(OP, g, o, operands)? else {
            return Ok(None);
        };
        let (grad_x, grad_weight) = (
            self.output(dtype, Image::Input.len(g, o))?,
            self.output(dtype, Image::Weight.len(g, o))?,
        );
        let shape = (g, o, dtype);
        let data = Pointers {
            x: grad_x.ptr,
            w: weight.ptr,
            y: grad.ptr,
        };
        let filter = Pointers {
            x: x.ptr,
            w: grad_weight.ptr,
            y: grad.ptr,
        };
        let workspace = |bytes| self.workspace(bytes);
        let input_gradient = || dnn.run(Direction::InputGradient, shape, data, workspace);
        let weight_gradient = || dnn.run(Direction::WeightGradient, shape, filter, workspace);
        if !self.gpu.timed("cudnn conv input gradient", input_gradient)?
            || !self.gpu.timed("cudnn conv weight gradient", weight_gradient)?
        {
            return Ok(None);
        }
        Ok(Some((grad_x as BufferRef, grad_weight as BufferRef)))
    }

    /// cuDNN and the operands, each checked for its extent, where cuDNN takes them: all of one
    /// float dtype, sizes it can index.
    #[allow(clippy::type_complexity)]
    fn dnn_operands<'a, const N: usize>(
        &self,
        op: &'static str,
        g: &Conv2dGeometry,
        o: usize,
        operands: [(&'a BufferRef, Image); N],
    ) -> Result<Option<(&Dnn, [&'a CudaBuffer; N], DType)>> {
        // cuDNN opens on the first convolution, with this device's context current.
        self.gpu.enter()?;
        let Some(dnn) = self.gpu.dnn() else {
            return Ok(None);
        };
        g.validate(op)?;
        let mut checked = Vec::with_capacity(N);
        for (b, image) in operands {
            let len = image.len(g, o);
            if len == 0 || len > i32::MAX as usize {
                return Ok(None);
            }
            checked.push(self.operand(op, b, Some(&Layout::contiguous([len])))?);
        }
        let dtype = checked[0].dtype();
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || checked.iter().any(|b| b.dtype() != dtype) {
            return Ok(None);
        }
        let Ok(checked) = checked.try_into() else {
            return Ok(None);
        };
        Ok(Some((dnn, checked, dtype)))
    }

    /// A workspace of `bytes` for a cuDNN call, freed in stream order once the call has run.
    fn workspace(&self, bytes: usize) -> Result<(u64, Arc<CudaBuffer>)> {
        let buffer = self.output(DType::F32, bytes.div_ceil(4))?;
        Ok((buffer.ptr, buffer))
    }
}
