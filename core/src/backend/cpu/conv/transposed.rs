//! A stride-1 convolution's input gradient as a convolution of the output gradient: padded by
//! `dilation·(k-1) - padding`, with the weight turned 180° and its channel axes swapped
//! (`[c, o, kh, kw]`). The fused backward passes unfold the gradient and run one product with a
//! long sum (`o·kh·kw`) into the input's `c x pixels`, instead of a product with a short sum
//! (`o`) into `c·kh·kw x pixels` columns folded back by `col2im`, which took 14% of a bf16
//! ResNet-18 step.

use super::unfold::{Planes, im2col_planes};
use crate::backend::Conv2dGeometry;
use crate::backend::cpu::pool::Pool;
use crate::dtype::Element;

/// The transposed convolution that gives the input gradient of a stride-1 convolution.
pub struct Transposed<T> {
    /// `[c, o·kh·kw]`: the weight turned 180° with its channel axes swapped.
    pub weight: Vec<T>,
    /// The sum's length, `o·kh·kw`.
    pub taps: usize,
    /// One image of the transposed convolution: the gradient's `o` channels of `oh x ow` in,
    /// the input's `h x w` out.
    image: Conv2dGeometry,
}

/// One image of the transposed convolution that gives `g`'s input gradient (`o` channels out):
/// the gradient's `o` channels of `oh x ow` in, the input's `h x w` out. None where `g` strides
/// (the gradient would need zeros between its pixels) or pads more than `dilation·(k-1)` (a
/// negative padding).
pub fn geometry(g: &Conv2dGeometry, o: usize) -> Option<Conv2dGeometry> {
    let reach = |k: usize, dilation: usize| dilation * k.saturating_sub(1);
    let (reach_h, reach_w) = (reach(g.kh, g.dilation[0]), reach(g.kw, g.dilation[1]));
    if g.stride != [1, 1] || g.padding[0] > reach_h || g.padding[1] > reach_w {
        return None;
    }
    let image = Conv2dGeometry {
        n: 1,
        c: o,
        h: g.out_h(),
        w: g.out_w(),
        kh: g.kh,
        kw: g.kw,
        stride: [1, 1],
        padding: [reach_h - g.padding[0], reach_w - g.padding[1]],
        dilation: g.dilation,
    };
    debug_assert_eq!((image.out_h(), image.out_w()), (g.h, g.w));
    Some(image)
}

impl<T: Element> Transposed<T> {
    /// The transposed convolution of `g` (`o` channels out, `weight` `[o, c, kh, kw]`), or None
    /// where it has none (see `geometry`).
    pub fn plan(pool: &Pool, g: &Conv2dGeometry, o: usize, weight: &[T]) -> Option<Transposed<T>> {
        let image = geometry(g, o)?;
        let kernel = g.kh * g.kw;
        let mut turned = pool.take::<T>(g.c * o * kernel);
        for (ci, row) in turned.chunks_exact_mut(o * kernel).enumerate() {
            for (oi, taps) in row.chunks_exact_mut(kernel).enumerate() {
                let source = &weight[(oi * g.c + ci) * kernel..][..kernel];
                taps.iter_mut().zip(source.iter().rev()).for_each(|(t, &s)| *t = s);
            }
        }
        Some(Transposed {
            weight: turned,
            taps: o * kernel,
            image,
        })
    }

    /// What unfolds into the columns of the `n` images from `first`: their output gradient
    /// (`[o, width]`, image i's pixels at column i·pixels) under the transposed geometry.
    pub fn unfolding<'a>(&self, grad: &'a [T], width: usize, first: usize, n: usize) -> Unfolding<'a, T> {
        let pixels = self.image.h * self.image.w;
        Unfolding {
            src: &grad[first * pixels..],
            planes: Planes {
                image: pixels,
                channel: width,
            },
            geometry: Conv2dGeometry { n, ..self.image },
        }
    }

    /// The input gradient of the `run.n` images from `start` into `grad_x_run`: has
    /// `multiply(unfolding, by_channel, inputs)` unfold their output gradient (`[o, width]`)
    /// as it needs and write `weight @ columns` (`c x inputs`) into `by_channel`, then lays
    /// that out image by image. For one image `by_channel` is `grad_x_run` itself; for more,
    /// the scratch `staging` (at least `c x inputs`).
    #[allow(clippy::too_many_arguments)]
    pub fn input_gradient(
        &self,
        staging: &mut [T],
        (grad, width): (&[T], usize),
        start: usize,
        run: &Conv2dGeometry,
        grad_x_run: &mut [T],
        multiply: impl FnOnce(Unfolding<'_, T>, &mut [T], usize),
    ) {
        let inputs = self.inputs(run.n);
        let unfolding = self.unfolding(grad, width, start, run.n);
        if run.n == 1 {
            multiply(unfolding, grad_x_run, inputs);
        } else {
            multiply(unfolding, staging, inputs);
            to_images(&staging[..run.c * inputs], grad_x_run, run.c, run.h * run.w);
        }
    }

    /// One image of the transposed convolution.
    pub fn geometry(&self) -> &Conv2dGeometry {
        &self.image
    }

    /// The input channels: the rows of the transposed convolution's product.
    pub fn channels(&self) -> usize {
        self.weight.len() / self.taps.max(1)
    }

    /// Output elements (input pixels) of `images` images.
    pub fn inputs(&self, images: usize) -> usize {
        images * self.image.out_h() * self.image.out_w()
    }

    pub fn recycle(self, pool: &Pool) {
        pool.recycle(T::into_host(self.weight));
    }
}

/// An output gradient to unfold: its planes under the transposed geometry.
pub struct Unfolding<'a, T> {
    pub src: &'a [T],
    pub planes: Planes,
    pub geometry: Conv2dGeometry,
}

impl<T: Element> Unfolding<'_, T> {
    /// Its columns (`o·kh·kw x n·h·w`) into the start of `cols`.
    pub fn unfold_into(&self, cols: &mut [T]) {
        im2col_planes(self.src, self.planes, cols, &self.geometry);
    }
}

/// `[c, n·plane]` (a product's rows, one per channel) -> `[n, c, plane]` (the images).
pub fn to_images<T: Copy>(by_channel: &[T], images: &mut [T], c: usize, plane: usize) {
    let n = images.len() / (c * plane).max(1);
    for (i, image) in images.chunks_exact_mut(c * plane).enumerate() {
        for (ch, dst) in image.chunks_exact_mut(plane).enumerate() {
            dst.copy_from_slice(&by_channel[(ch * n + i) * plane..][..plane]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_images_lays_channel_rows_out_image_by_image() {
        // Two images, three channels, planes of two: by_channel[ch][i][p] = 100ch + 10i + p.
        let by_channel: Vec<u32> = (0..3)
            .flat_map(|ch| (0..2).flat_map(move |i| (0..2).map(move |p| 100 * ch + 10 * i + p)))
            .collect();
        let mut images = vec![0u32; 12];
        to_images(&by_channel, &mut images, 3, 2);
        assert_eq!(images, [0, 1, 100, 101, 200, 201, 10, 11, 110, 111, 210, 211]);
    }
}
