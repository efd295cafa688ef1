//! A replica's share of the optimizer state sent to rank 0 in point-to-point messages, for
//! replicas in other processes: a header (names, dtypes, shapes, scalars) as bytes, then each
//! tensor's buffer as it lies on the device. Rank 0 asks by a broadcast every rank takes part in.

use serde::{Deserialize, Serialize};

use crate::backend::Communicator;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::optim::OptimizerState;
use crate::tensor::Tensor;

/// The dtypes a header names, by index.
const DTYPES: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U32];

#[derive(Serialize, Deserialize)]
struct Header {
    /// Name, dtype index, shape.
    tensors: Vec<(String, usize, Vec<usize>)>,
    scalars: Vec<(String, f64)>,
}

fn send_words(comm: &dyn Communicator, device: &Device, words: &[u32], to: usize) -> Result<()> {
    let t = Tensor::from_slice(words, [words.len()], device)?;
    comm.send(t.buffer(), to)
}

fn recv_words(comm: &dyn Communicator, device: &Device, len: usize, from: usize) -> Result<Vec<u32>> {
    let t = Tensor::zeros([len], DType::U32, device)?;
    comm.recv(t.buffer(), from)?;
    t.to_vec::<u32>()
}

/// Sends `state` to rank `to`, which takes it with `recv_state`.
pub(super) fn send_state(comm: &dyn Communicator, device: &Device, state: &OptimizerState, to: usize) -> Result<()> {
    let tensors = state
        .tensors
        .iter()
        .map(|(name, t)| {
            let dtype = DTYPES.iter().position(|&d| d == t.dtype()).unwrap_or(0);
            (name.clone(), dtype, t.dims().to_vec())
        })
        .collect();
    let header = Header {
        tensors,
        scalars: state.scalars.clone(),
    };
    let bytes =
        serde_json::to_vec(&header).map_err(|e| Error::invalid("ZeRO", format!("cannot encode a share: {e}")))?;
    send_words(comm, device, &[bytes.len() as u32], to)?;
    send_words(
        comm,
        device,
        &bytes.iter().map(|&b| u32::from(b)).collect::<Vec<_>>(),
        to,
    )?;
    for (_, t) in &state.tensors {
        comm.send(t.contiguous()?.buffer(), to)?;
    }
    Ok(())
}

/// The state rank `from` sent with `send_state`, on `device`.
pub(super) fn recv_state(comm: &dyn Communicator, device: &Device, from: usize) -> Result<OptimizerState> {
    let len = recv_words(comm, device, 1, from)?[0] as usize;
    let bytes: Vec<u8> = recv_words(comm, device, len, from)?
        .into_iter()
        .map(|w| w as u8)
        .collect();
    let header: Header = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid("ZeRO", format!("rank {from} sent a share that does not read: {e}")))?;
    let tensors = header
        .tensors
        .into_iter()
        .map(|(name, dtype, dims)| {
            let t = Tensor::zeros(dims, DTYPES.get(dtype).copied().unwrap_or(DType::F32), device)?;
            comm.recv(t.buffer(), from)?;
            Ok((name, t))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(OptimizerState {
        tensors,
        scalars: header.scalars,
    })
}

/// Rank 0's word to every rank: `ask` (true: send me your shares; false: that was all).
/// Every rank takes part; returns rank 0's word.
pub(super) fn rank_0_asks(comm: &dyn Communicator, device: &Device, ask: bool) -> Result<bool> {
    let word = Tensor::from_slice(&[u32::from(ask)], [1], device)?;
    comm.broadcast(word.buffer(), 0)?;
    Ok(word.to_vec::<u32>()?[0] == 1)
}

/// Whether this group carries point-to-point messages: each rank sends rank 0 one word. An
/// error on every rank where it does not.
pub(super) fn check_messages(comm: &dyn Communicator, device: &Device) -> Result<()> {
    let result = if comm.rank() == 0 {
        (1..comm.world_size()).try_for_each(|from| recv_words(comm, device, 1, from).map(drop))
    } else {
        send_words(comm, device, &[comm.rank() as u32], 0)
    };
    result.map_err(|e| {
        Error::invalid(
            "ZeRO",
            format!(
                "replicas in separate processes send rank 0 their shares of the optimizer state for its checkpoints, \
                 and this communicator cannot ({e}); use MPI (CPU and wgpu devices), or run the replicas in one process \
                 (--devices), or train without --zero"
            ),
        )
    })
}
