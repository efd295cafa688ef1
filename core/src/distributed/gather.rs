//! Small host values gathered from every rank (model fingerprints, step times), through the
//! same communicator as the gradients.

use crate::backend::Communicator;
use crate::device::Device;
use crate::dtype::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// Every rank's `mine` (the same length on every rank), concatenated in rank order.
pub fn all_gather_values<T: Element>(comm: &dyn Communicator, device: &Device, mine: Vec<T>) -> Result<Vec<T>> {
    let len = mine.len();
    let input = Tensor::from_host(T::into_host(mine), [len], device)?;
    let output = Tensor::zeros([len * comm.world_size()], T::DTYPE, device)?;
    comm.all_gather(input.buffer(), output.buffer())?;
    output.to_vec::<T>()
}
