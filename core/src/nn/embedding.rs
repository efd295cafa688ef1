//! A lookup table: token ids to learned vectors, `weight` [num_embeddings, dim] as PyTorch's
//! `nn.Embedding` (initialised N(0, 1)).

use super::layer_error::raised_by;
use super::module::{Module, join_name, remap};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensor::Tensor;

/// A lookup table from integer ids (u32 or i64, any shape) to learned vectors, as `torch.nn.Embedding`.
pub struct Embedding {
    /// `[num_embeddings, dim]` f32, initialised N(0, 1); row `i` is id `i`'s vector.
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `num_embeddings` vectors of width `dim`, drawn N(0, 1) from `generator`.
    pub fn new(num_embeddings: usize, dim: usize, device: &Device, generator: &Generator) -> Result<Embedding> {
        let weight = Tensor::rand_normal([num_embeddings, dim], 0.0, 1.0, DType::F32, generator, device)?;
        Ok(Embedding {
            weight: weight.requires_grad(true),
        })
    }
}

impl Module for Embedding {
    fn map_tensors(&mut self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor>) -> Result<()> {
        remap(&mut self.weight, f)
    }
    /// Ids of any shape (u32 or i64) to vectors: the shape with `dim` appended.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype().is_float() {
            return Err(Error::invalid(
                "Embedding",
                format!("ids must be integers (u32 or i64), got {}", ids.dtype()),
            ));
        }
        let mut dims = ids.dims().to_vec();
        dims.push(self.weight.dims()[1]);
        let flat = ids.reshape([ids.elem_count()])?;
        raised_by(self.weight.index_select(0, &flat), &self.weight)?.reshape(dims)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        f(join_name(prefix, "weight"), &self.weight);
    }
    fn describe(&self) -> String {
        let d = self.weight.dims();
        format!("Embedding({}, {})", d[0], d[1])
    }
}
