//! Collapses a range of axes into one, PyTorch's `nn.Flatten(start_dim=1, end_dim=-1)`.

use super::module::Module;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Collapses axes `start_dim..=end_dim` into one, as `torch.nn.Flatten` (default: every axis after the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flatten {
    start_dim: isize,
    end_dim: isize,
}

impl Default for Flatten {
    /// Keeps the batch axis, flattens the rest.
    fn default() -> Self {
        Flatten {
            start_dim: 1,
            end_dim: -1,
        }
    }
}

impl Flatten {
    /// Flattens every axis after the batch axis (`start_dim=1, end_dim=-1`), PyTorch's default.
    pub fn new() -> Self {
        Flatten::default()
    }
    /// Axes `start_dim..=end_dim` (negative counts from the end), checked against each input.
    pub fn with_dims(start_dim: isize, end_dim: isize) -> Self {
        Flatten { start_dim, end_dim }
    }
}

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (start, end) = (
            x.shape().axis("Flatten", self.start_dim)?,
            x.shape().axis("Flatten", self.end_dim)?,
        );
        if start > end {
            return Err(Error::invalid(
                "Flatten",
                format!(
                    "start_dim {} comes after end_dim {} for input of shape {}",
                    self.start_dim,
                    self.end_dim,
                    x.shape()
                ),
            ));
        }
        let dims = x.dims();
        let mut out = dims[..start].to_vec();
        out.push(dims[start..=end].iter().product());
        out.extend_from_slice(&dims[end + 1..]);
        x.reshape(out)
    }
    fn describe(&self) -> String {
        format!("Flatten(start_dim={}, end_dim={})", self.start_dim, self.end_dim)
    }
}
