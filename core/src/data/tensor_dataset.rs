//! PyTorch's `TensorDataset`: samples cut from whole arrays held in memory, row `i` of each
//! array being sample `i`'s field (features, labels, …).

use super::batch::HostTensor;
use super::dataset::{Dataset, Sample};
use crate::error::{Error, Result};
use crate::shape::Shape;

/// PyTorch's `TensorDataset`: sample `i` is row `i` of each of a few arrays held in memory.
pub struct TensorDataset {
    fields: Vec<HostTensor>,
    len: usize,
}

impl TensorDataset {
    /// Arrays whose first dimension counts the samples, the same in all of them, e.g.
    /// `[features [N, 8] f32, labels [N] u32]`.
    pub fn new(fields: Vec<HostTensor>) -> Result<TensorDataset> {
        let Some(first) = fields.first() else {
            return Err(Error::invalid("TensorDataset", "needs at least one array"));
        };
        let len = *first.shape.dims().first().ok_or_else(|| {
            Error::invalid(
                "TensorDataset",
                "a scalar has no samples: each array's first dimension counts them",
            )
        })?;
        for (i, f) in fields.iter().enumerate() {
            if f.shape.dims().first() != Some(&len) {
                return Err(Error::invalid(
                    "TensorDataset",
                    format!(
                        "array {i} has shape {} but array 0 has {len} samples: every array's first dimension must be {len}",
                        f.shape
                    ),
                ));
            }
        }
        Ok(TensorDataset { fields, len })
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.len
    }
    fn get(&self, index: usize) -> Result<Sample> {
        if index >= self.len {
            return Err(Error::invalid(
                "TensorDataset",
                format!("index {index} is out of range for {} samples", self.len),
            ));
        }
        self.fields
            .iter()
            .map(|f| {
                let row: Shape = f.shape.dims()[1..].to_vec().into();
                let n = row.elem_count();
                HostTensor::new(f.data.slice(index * n..(index + 1) * n), row)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HostVec;

    #[test]
    fn rows_become_samples_and_bad_shapes_are_named() {
        let x = HostTensor::new(HostVec::F32((0..6).map(|v| v as f32).collect()), [3, 2]).unwrap();
        let y = HostTensor::new(HostVec::U32(vec![7, 8, 9]), [3]).unwrap();
        let data = TensorDataset::new(vec![x.clone(), y]).unwrap();
        assert_eq!(data.len(), 3);
        let sample = data.get(1).unwrap();
        assert_eq!(sample[0].data, HostVec::F32(vec![2.0, 3.0]));
        assert_eq!(sample[0].shape.dims(), &[2]);
        assert_eq!(sample[1].data, HostVec::U32(vec![8]));
        assert!(data.get(3).is_err());
        let short = HostTensor::new(HostVec::U32(vec![1, 2]), [2]).unwrap();
        let err = TensorDataset::new(vec![x, short]).err().unwrap().to_string();
        assert!(err.contains("array 1") && err.contains("must be 3"), "{err}");
        assert!(TensorDataset::new(vec![]).is_err());
    }
}
