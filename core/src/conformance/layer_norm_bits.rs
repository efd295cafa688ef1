//! The bits of LayerNorm's gradients for a shape whose column sums span many chunks of rows, so
//! a test can check that two runs on one device agree bit for bit (the weight's and bias's
//! gradients are sums over every row, in an order the backend must fix by the shape alone).

use crate::device::Device;
use crate::error::Result;
use crate::tensor::Tensor;

/// The bits of the input's, the weight's and the bias's gradients of `sum(layer_norm(x) * r)`
/// for a `[rows, cols]` f32 input of fixed values on `device`.
pub fn layer_norm_gradient_bits(device: &Device, rows: usize, cols: usize) -> Result<Vec<Vec<u32>>> {
    let values = |dims: &[usize], k: usize| {
        let n = dims.iter().product::<usize>();
        let v: Vec<f32> = (0..n).map(|i| ((i * k) % 97) as f32 / 24.0 - 2.0).collect();
        Tensor::from_vec(v, dims.to_vec(), device)
    };
    let x = values(&[rows, cols], 37)?.requires_grad(true);
    let w = values(&[cols], 11)?.requires_grad(true);
    let b = values(&[cols], 5)?.requires_grad(true);
    let r = values(&[rows, cols], 13)?;
    x.layer_norm(Some(&w), Some(&b), 1e-5)?.mul(&r)?.sum_all()?.backward()?;
    [x, w, b]
        .iter()
        .map(|t| {
            let grad = t.grad().expect("each input requires its gradient");
            Ok(grad.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
        })
        .collect()
}
