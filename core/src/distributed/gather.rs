//! Small host values gathered from every rank (model fingerprints, step times), through the
//! same communicator as the gradients.

use crate::backend::Communicator;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// Every rank's `mine` (the same length on every rank), concatenated in rank order.
pub(crate) fn all_gather_values<T: Element>(comm: &dyn Communicator, device: &Device, mine: Vec<T>) -> Result<Vec<T>> {
    let len = mine.len();
    let input = Tensor::from_host(T::into_host(mine), [len], device)?;
    let output = Tensor::zeros([len * comm.world_size()], T::DTYPE, device)?;
    comm.all_gather(input.buffer(), output.buffer())?;
    output.to_vec::<T>()
}

/// Every rank's `mine`, in rank order: each string's bytes, padded to the longest, go as one
/// gather of numbers (as PyTorch's `all_gather_object` sends pickles as byte tensors).
pub(crate) fn all_gather_strings(comm: &dyn Communicator, device: &Device, mine: &str) -> Result<Vec<String>> {
    let lens = all_gather_values(comm, device, vec![mine.len() as f32])?;
    let longest = lens.iter().fold(0.0f32, |a, &b| a.max(b)) as usize;
    let mut bytes: Vec<f32> = mine.bytes().map(f32::from).collect();
    bytes.resize(longest, 0.0);
    let all = all_gather_values(comm, device, bytes)?;
    Ok(lens
        .iter()
        .enumerate()
        .map(|(rank, &len)| {
            let start = rank * longest;
            let text: Vec<u8> = all[start..start + len as usize].iter().map(|&b| b as u8).collect();
            String::from_utf8_lossy(&text).into_owned()
        })
        .collect())
}
