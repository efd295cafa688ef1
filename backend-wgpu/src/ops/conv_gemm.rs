//! Convolutions as implicit GEMM (conv_gemm.wgsl): the backend's `conv2d_product` and its
//! backward, one dispatch a product (two where k is split), the im2col operand gathered as tiles
//! are staged, so neither an im2col matrix nor col2im's input is ever allocated.
//! `ConvKernel` (`LOCKSTEP_WGPU_CONV`) and `takes_implicit_conv` decide which convolutions run
//! here; the others return `None`, and core composes im2col, matmul and col2im as before.

use std::sync::OnceLock;

use lockstep_core::backend::{Backend, BufferRef, Conv2dGeometry, MatmulDims};
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::cooperative::Policy;
use crate::ops::matmul::split_k_chunk;
use crate::pipelines::Variant;

/// Output rows and columns per workgroup (`TILE` in conv_gemm.wgsl).
const TILE: usize = 64;

/// How the backend runs a convolution's products. `LOCKSTEP_WGPU_CONV` (`auto`, `implicit`,
/// `im2col`) chooses for the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvKernel {
    /// Implicit GEMM, except for the dtypes the cooperative-matrix tier takes (whose tensor-core
    /// products beat the SIMT tiles even with im2col's extra pass).
    Auto,
    /// Implicit GEMM (conv_gemm.wgsl) for every convolution of one group.
    Implicit,
    /// im2col, matmul and col2im, composed by core.
    Im2col,
}

impl ConvKernel {
    const ALL: [ConvKernel; 3] = [ConvKernel::Auto, ConvKernel::Implicit, ConvKernel::Im2col];

    fn name(self) -> &'static str {
        match self {
            ConvKernel::Auto => "auto",
            ConvKernel::Implicit => "implicit",
            ConvKernel::Im2col => "im2col",
        }
    }

    /// `LOCKSTEP_WGPU_CONV`, read once: `Auto` where it is unset or names no kernel (said once).
    pub(crate) fn from_env() -> ConvKernel {
        static CHOSEN: OnceLock<ConvKernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_CONV") {
            Err(_) => ConvKernel::Auto,
            Ok(name) => ConvKernel::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(|| {
                    eprintln!("lockstep: LOCKSTEP_WGPU_CONV={name:?} is none of auto, implicit, im2col; ignored");
                    ConvKernel::Auto
                }),
        })
    }
}

/// One of the three products of a convolution (`PRODUCT` in conv_gemm.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConvProduct {
    /// `[o, n*oh*ow]` = weight @ im2col(x).
    Forward,
    /// `[n, c, h, w]`, each pixel gathering the gradients of the outputs that read it.
    InputGrad,
    /// `[o, c*kh*kw]` = grad @ im2col(x)^T.
    WeightGrad,
}

impl ConvProduct {
    fn constant(self) -> f64 {
        match self {
            ConvProduct::Forward => 0.0,
            ConvProduct::InputGrad => 1.0,
            ConvProduct::WeightGrad => 2.0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ConvProduct::Forward => "conv2d_product",
            ConvProduct::InputGrad | ConvProduct::WeightGrad => "conv2d_product_backward",
        }
    }

    /// The product's (m, n, k) for `g` with `o` output channels.
    fn dims(self, g: &Conv2dGeometry, o: usize) -> MatmulDims {
        let (pixels, taps) = (g.n * g.out_h() * g.out_w(), g.kh * g.kw);
        let (m, n, k) = match self {
            ConvProduct::Forward => (o, pixels, g.c * taps),
            ConvProduct::InputGrad => (g.c, g.n * g.h * g.w, o * taps),
            ConvProduct::WeightGrad => (o, g.c * taps, pixels),
        };
        MatmulDims { batch: 1, m, n, k }
    }

    /// The chunk of k each workgroup sums, as matmul splits the same shape (so the split, and
    /// with it the result's bits, depends on the shape alone); never for the input gradient,
    /// whose NCHW output the split's flat sum does not write.
    fn split(self, dims: MatmulDims) -> Option<usize> {
        (self != ConvProduct::InputGrad).then(|| split_k_chunk(dims)).flatten()
    }

    /// Whether a bf16 output can be written two elements a word: no pair straddles two rows
    /// (or two images of the input gradient), or the split's sum writes it in flat order.
    fn packs_bf16(self, g: &Conv2dGeometry, dims: MatmulDims) -> bool {
        match self {
            ConvProduct::InputGrad => (g.h * g.w).is_multiple_of(2),
            _ => dims.n.is_multiple_of(2) || self.split(dims).is_some(),
        }
    }
}

impl WgpuBackend {
    /// Whether the implicit kernels run a convolution of `dtype` under `kernel`: the one place
    /// that decides (groups > 1 never reach the backend's fused products).
    fn takes_implicit_conv(&self, kernel: ConvKernel, dtype: DType) -> bool {
        match kernel {
            ConvKernel::Implicit => true,
            ConvKernel::Im2col => false,
            ConvKernel::Auto => !(self.cooperative_tier().is_some() && Policy::from_env().takes(dtype)),
        }
    }

    /// `Backend::conv2d_product`: `[o, n*oh*ow]`, or None where the implicit kernels decline.
    pub(crate) fn conv_implicit(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        g: &Conv2dGeometry,
        o: usize,
    ) -> Option<Result<BufferRef>> {
        self.takes_implicit_conv(ConvKernel::from_env(), x.dtype())
            .then(|| self.conv_product(ConvProduct::Forward, weight, x, g, o))
    }

    /// `Backend::conv2d_product_backward`: the input's gradient `[n, c, h, w]` and the weight's
    /// `[o, c*kh*kw]` from `grad` `[o, n*oh*ow]`, or None where the implicit kernels decline.
    pub(crate) fn conv_implicit_backward(
        &self,
        x: &BufferRef,
        weight: &BufferRef,
        grad: &BufferRef,
        g: &Conv2dGeometry,
        o: usize,
    ) -> Option<Result<(BufferRef, BufferRef)>> {
        if !self.takes_implicit_conv(ConvKernel::from_env(), x.dtype()) {
            return None;
        }
        Some((|| {
            let grad_x = self.conv_product(ConvProduct::InputGrad, weight, grad, g, o)?;
            let grad_weight = self.conv_product(ConvProduct::WeightGrad, grad, x, g, o)?;
            Ok((grad_x, grad_weight))
        })())
    }

    /// `product` of `lhs` and `rhs` (see conv_gemm.wgsl for which is which), checked; bf16
    /// through f32 copies where its output cannot be written in whole words.
    fn conv_product(
        &self,
        product: ConvProduct,
        lhs: &BufferRef,
        rhs: &BufferRef,
        g: &Conv2dGeometry,
        o: usize,
    ) -> Result<BufferRef> {
        let op = product.name();
        g.validate(op)?;
        if lhs.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: lhs.dtype(),
                rhs: rhs.dtype(),
            });
        }
        let (image, weight, grad) = (
            g.n * g.c * g.h * g.w,
            o * g.c * g.kh * g.kw,
            o * g.n * g.out_h() * g.out_w(),
        );
        let (lhs_len, rhs_len) = match product {
            ConvProduct::Forward => (weight, image),
            ConvProduct::InputGrad => (weight, grad),
            ConvProduct::WeightGrad => (grad, image),
        };
        for (what, b, needed) in [("lhs", lhs, lhs_len), ("rhs", rhs, rhs_len)] {
            if b.len() < needed {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{g:?} with {o} output channels needs {needed} elements in the {what} operand, the buffer has {}",
                        b.len()
                    ),
                ));
            }
        }
        let dims = product.dims(g, o);
        if lhs.dtype() != DType::BF16 || product.packs_bf16(g, dims) {
            return self.conv_product_with(product, lhs, rhs, g, dims);
        }
        self.in_f32(op, [lhs, rhs], |[lhs, rhs]| {
            self.conv_product_with(product, lhs, rhs, g, dims)
        })
    }

    /// The dispatch (and the split's sum) of `product`, whose operands are checked.
    fn conv_product_with(
        &self,
        product: ConvProduct,
        lhs: &BufferRef,
        rhs: &BufferRef,
        g: &Conv2dGeometry,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        let op = product.name();
        let (a, b) = (self.operand(op, lhs, None)?, self.operand(op, rhs, None)?);
        let t = self.element_type(op, a.dtype())?;
        let MatmulDims { m, n, k, .. } = dims;
        if k == 0 || a.len() == 0 || b.len() == 0 {
            // Nothing to sum (no channels or images, or an image of no pixels, all padding): the
            // shader, which runs unchecked, clamps its reads into operands it assumes not empty.
            return Backend::zeros(self, a.dtype(), m * n);
        }
        let out = self.alloc(op, a.dtype(), m * n)?;
        if m * n == 0 {
            return Ok(out);
        }
        let split = product.split(dims);
        let mut params = vec![m, n, k, split.unwrap_or(k), g.n, g.c, g.h, g.w, g.kh, g.kw];
        params.extend(g.stride.iter().chain(&g.padding).chain(&g.dilation));
        params.extend([g.out_h(), g.out_w()]);
        let params = params
            .into_iter()
            .map(|v| to_u32(op, v))
            .collect::<Result<Vec<u32>>>()?;
        // Element indices are u32 in the shader: every operand and the output must fit.
        for len in [a.len(), b.len(), m * n] {
            to_u32(op, len)?;
        }
        let variant = |entry| Variant::new("conv_gemm", entry, &[t]).constant("PRODUCT", product.constant());
        let blocks = m.div_ceil(TILE) * n.div_ceil(TILE);
        let Some(chunk) = split else {
            self.launch(
                &variant("conv_gemm"),
                &params,
                &[(1, a), (2, b), (3, &out)],
                self.groups(op, blocks)?,
            )?;
            return Ok(out);
        };
        // Each split's blocks write f32 partial products, which matmul's sum adds in split order.
        let splits = k.div_ceil(chunk);
        let partials = self.alloc(op, DType::F32, splits * m * n)?;
        self.launch(
            &variant("conv_gemm_split"),
            &params,
            &[(1, a), (2, b), (4, &partials)],
            self.groups(op, splits * blocks)?,
        )?;
        self.launch(
            &Variant::new("matmul", "matmul_split_sum", &[t]),
            &[to_u32(op, m * n)?, to_u32(op, splits)?],
            &[(3, &out), (4, &partials)],
            self.word_grid(op, a.dtype(), m * n)?,
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(n: usize, c: usize, hw: [usize; 2], k: usize, stride: usize, padding: usize) -> Conv2dGeometry {
        Conv2dGeometry {
            n,
            c,
            h: hw[0],
            w: hw[1],
            kh: k,
            kw: k,
            stride: [stride; 2],
            padding: [padding; 2],
            dilation: [1, 1],
        }
    }

    #[test]
    fn the_products_shapes_follow_the_convolution() {
        // ResNet-18's stem at batch 2: 7x7 stride 2 over 3x32x32 into 64 channels of 16x16.
        let g = geometry(2, 3, [32, 32], 7, 2, 3);
        let dims = |p: ConvProduct| {
            let d = p.dims(&g, 64);
            (d.m, d.n, d.k)
        };
        assert_eq!(dims(ConvProduct::Forward), (64, 512, 147));
        assert_eq!(dims(ConvProduct::InputGrad), (3, 2048, 64 * 49));
        assert_eq!(dims(ConvProduct::WeightGrad), (64, 147, 512));
    }

    #[test]
    fn only_row_major_outputs_split_k() {
        // A weight gradient over half a million pixels splits as matmul would; the input
        // gradient, written NCHW, never does.
        let g = geometry(512, 3, [32, 32], 3, 1, 1);
        let wg = ConvProduct::WeightGrad.dims(&g, 64);
        assert_eq!(ConvProduct::WeightGrad.split(wg), split_k_chunk(wg));
        assert!(ConvProduct::WeightGrad.split(wg).is_some());
        let deep = geometry(1, 512, [4, 4], 3, 1, 1);
        let ig = ConvProduct::InputGrad.dims(&deep, 512);
        assert!(split_k_chunk(ig).is_some());
        assert_eq!(ConvProduct::InputGrad.split(ig), None);
    }

    #[test]
    fn bf16_is_packed_only_where_no_word_straddles_rows() {
        let odd = geometry(1, 2, [3, 5], 3, 1, 1);
        assert!(!ConvProduct::InputGrad.packs_bf16(&odd, ConvProduct::InputGrad.dims(&odd, 4)));
        assert!(!ConvProduct::Forward.packs_bf16(&odd, ConvProduct::Forward.dims(&odd, 4)));
        let even = geometry(2, 2, [4, 5], 3, 1, 1);
        assert!(ConvProduct::InputGrad.packs_bf16(&even, ConvProduct::InputGrad.dims(&even, 4)));
        assert!(ConvProduct::Forward.packs_bf16(&even, ConvProduct::Forward.dims(&even, 4)));
    }
}
