//! Input handling shared by the image layers (Conv2d, MaxPool2d, AvgPool2d): PyTorch accepts a
//! batch `[N, C, H, W]` or a single image `[C, H, W]`.

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Runs `f` on a 4-D batch; a 3-D image goes in as a batch of one and comes back 3-D.
pub(super) fn per_image(layer: &'static str, x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match x.rank() {
        4 => f(x),
        3 => f(&x.unsqueeze(0)?)?.squeeze(0),
        _ => Err(Error::invalid(
            layer,
            format!("expects input [N, C, H, W] or [C, H, W], got shape {}", x.shape()),
        )),
    }
}

/// A pair as PyTorch prints it when given as one number: `2` for `[2, 2]`, else `(2, 3)`.
pub(super) fn pair_or_int(v: [usize; 2]) -> String {
    if v[0] == v[1] { v[0].to_string() } else { pair(v) }
}

/// A pair as a Python tuple: `(5, 5)`.
pub(super) fn pair(v: [usize; 2]) -> String {
    format!("({}, {})", v[0], v[1])
}
