//! Host-side samples and batches, and collation (stacking samples along a new first axis).

use crate::device::Device;
use crate::dtype::HostVec;
use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// An array in host memory: what datasets produce and what a batch carries to the device.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// The values in row-major order, in their dtype.
    pub data: HostVec,
    /// The dimensions; `data` holds exactly their product of values.
    pub shape: Shape,
}

impl HostTensor {
    /// Pairs `data` with `shape`; an error unless the element counts match.
    pub fn new(data: HostVec, shape: impl Into<Shape>) -> Result<HostTensor> {
        let shape = shape.into();
        if data.len() != shape.elem_count() {
            return Err(Error::invalid(
                "HostTensor",
                format!("{} values do not fill shape {shape}", data.len()),
            ));
        }
        Ok(HostTensor { data, shape })
    }
    /// Copies it to `device` as a tensor of the same dtype and shape.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        Tensor::from_host(self.data.clone(), self.shape.clone(), device)
    }
}

/// One batch: each field stacked over the samples, plus the dataset indices it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Each sample field stacked along a new first axis of the batch's length, e.g. images
    /// `[n, c, h, w]` and labels `[n]`.
    pub fields: Vec<HostTensor>,
    /// The dataset index of each sample, in batch order.
    pub indices: Vec<usize>,
}

impl Batch {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }
    /// True when the batch holds no samples.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
    /// A batch of one as that one sample: each field without its leading axis of size 1.
    pub fn into_sample(self) -> Vec<HostTensor> {
        self.fields
            .into_iter()
            .map(|f| HostTensor {
                shape: Shape::new(&f.shape.dims()[1..]),
                data: f.data,
            })
            .collect()
    }
    /// Copies every field to `device`.
    pub fn to_device(&self, device: &Device) -> Result<Vec<Tensor>> {
        self.fields.iter().map(|f| f.to_device(device)).collect()
    }
}

/// Stacks samples (each a list of fields) into a batch; every sample must have the same fields
/// with the same shapes and dtypes, and the error names the first sample that differs.
pub fn collate(samples: Vec<Vec<HostTensor>>, indices: Vec<usize>) -> Result<Batch> {
    let Some(first) = samples.first() else {
        return Ok(Batch {
            fields: Vec::new(),
            indices,
        });
    };
    let template: Vec<(Shape, crate::dtype::DType)> = first.iter().map(|f| (f.shape.clone(), f.data.dtype())).collect();
    for (sample, &index) in samples.iter().zip(&indices) {
        let matches = sample.len() == template.len()
            && sample
                .iter()
                .zip(&template)
                .all(|(f, (s, d))| &f.shape == s && f.data.dtype() == *d);
        if !matches {
            let got: Vec<String> = sample
                .iter()
                .map(|f| format!("{} {}", f.data.dtype(), f.shape))
                .collect();
            let want: Vec<String> = template.iter().map(|(s, d)| format!("{d} {s}")).collect();
            return Err(Error::data(
                format!("sample {index}"),
                format!(
                    "fields [{}] differ from the batch's first sample [{}]",
                    got.join(", "),
                    want.join(", ")
                ),
            ));
        }
    }
    let n = samples.len();
    let mut columns: Vec<Vec<HostVec>> = vec![Vec::with_capacity(n); template.len()];
    for sample in samples {
        for (col, field) in columns.iter_mut().zip(sample) {
            col.push(field.data);
        }
    }
    let fields = columns
        .into_iter()
        .zip(template)
        .map(|(col, (shape, _))| {
            let mut dims = vec![n];
            dims.extend_from_slice(shape.dims());
            HostTensor {
                data: concat_host(col),
                shape: Shape::new(dims),
            }
        })
        .collect();
    Ok(Batch { fields, indices })
}

/// Concatenates host vectors of one dtype (checked by `collate`).
fn concat_host(parts: Vec<HostVec>) -> HostVec {
    let mut iter = parts.into_iter();
    let mut acc = iter.next().expect("collate passes at least one sample");
    for part in iter {
        match (&mut acc, part) {
            (HostVec::F32(a), HostVec::F32(b)) => a.extend(b),
            (HostVec::F16(a), HostVec::F16(b)) => a.extend(b),
            (HostVec::BF16(a), HostVec::BF16(b)) => a.extend(b),
            (HostVec::F64(a), HostVec::F64(b)) => a.extend(b),
            (HostVec::I64(a), HostVec::I64(b)) => a.extend(b),
            (HostVec::U32(a), HostVec::U32(b)) => a.extend(b),
            _ => unreachable!("collate checked that every sample has the same dtypes"),
        }
    }
    acc
}
