//! Average pooling to a fixed output size (PyTorch's `adaptive_avg_pool2d`), composed from ops
//! every backend already has: a mean for one output cell, `avg_pool2d` when the windows tile the
//! input evenly, else one product with a fixed averaging matrix.

use super::Tensor;
use super::nn_ops::Pool2dOptions;
use crate::dtype::HostVec;
use crate::error::{Error, Result};

/// PyTorch's window of output cell `i` of `out` along an input axis of `len`:
/// `floor(i·len/out) .. ceil((i+1)·len/out)`.
fn window(i: usize, len: usize, out: usize) -> std::ops::Range<usize> {
    (i * len / out)..((i + 1) * len).div_ceil(out)
}

/// `[h·w, oh·ow]`: column `(i, j)` holds 1/area over the pixels of output cell (i, j)'s window.
/// Built in f64 and rounded once into the input's dtype, so each gets its nearest 1/area.
fn averaging_matrix(h: usize, w: usize, oh: usize, ow: usize) -> Vec<f64> {
    let mut m = vec![0f64; h * w * oh * ow];
    for i in 0..oh {
        for j in 0..ow {
            let (rows, cols) = (window(i, h, oh), window(j, w, ow));
            let share = 1.0 / (rows.len() * cols.len()) as f64;
            for y in rows {
                for x in cols.clone() {
                    m[(y * w + x) * oh * ow + i * ow + j] = share;
                }
            }
        }
    }
    m
}

impl Tensor {
    /// Averages `[n, c, h, w]` into `[n, c, oh, ow]`, each output cell over its window of the
    /// input (windows may overlap and differ in size when `h` is not a multiple of `oh`).
    pub fn adaptive_avg_pool2d(&self, output: [usize; 2]) -> Result<Tensor> {
        self.float_only("adaptive_avg_pool2d")?;
        let [n, c, h, w] = self.nchw("adaptive_avg_pool2d")?;
        let [oh, ow] = output;
        if oh == 0 || ow == 0 || h == 0 || w == 0 {
            return Err(Error::invalid(
                "adaptive_avg_pool2d",
                format!(
                    "needs a non-empty input plane and output size, got input {} and output {output:?}",
                    self.shape()
                ),
            ));
        }
        if output == [1, 1] {
            return self.mean(&[2, 3], true);
        }
        if h.is_multiple_of(oh) && w.is_multiple_of(ow) {
            let kernel = [h / oh, w / ow];
            let options = Pool2dOptions {
                kernel,
                stride: kernel,
                padding: [0, 0],
            };
            return self.avg_pool2d(options);
        }
        let weights = Tensor::from_host(
            HostVec::from_f64(self.dtype(), &averaging_matrix(h, w, oh, ow)),
            [h * w, oh * ow],
            self.device(),
        )?;
        self.reshape([n * c, h * w])?.matmul(&weights)?.reshape([n, c, oh, ow])
    }
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn windows_follow_pytorch_start_and_end_rule() {
        // Input 5 into 3 cells: PyTorch's windows are [0,2), [1,4), [3,5).
        let got: Vec<_> = (0..3).map(|i| window(i, 5, 3)).collect();
        assert_eq!(got, vec![0..2, 1..4, 3..5]);
        // An output larger than the input repeats pixels: 2 into 3 gives [0,1), [0,2), [1,2).
        let got: Vec<_> = (0..3).map(|i| window(i, 2, 3)).collect();
        assert_eq!(got, vec![0..1, 0..2, 1..2]);
    }
}
