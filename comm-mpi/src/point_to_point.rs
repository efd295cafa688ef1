//! Point-to-point messages: a two-word header (dtype, length) and then the data, so the
//! receiver sizes its buffer from what was sent and can say how it differs from its own.

use ::mpi::point_to_point::{Destination as _, Source as _};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::Communicator as _;

use lockstep_core::dtype::HostVec;
use lockstep_core::error::{Error, Result};

use crate::header::{dtype_code, dtype_of};
use crate::host::{bytes, bytes_mut, zeros};

pub(super) fn send(comm: &SimpleCommunicator, to: usize, host: &HostVec) {
    let peer = comm.process_at_rank(to as i32);
    let header = [dtype_code(host.dtype()), host.len() as u64];
    peer.send(&header[..]);
    peer.send(bytes(host));
}

pub(super) fn recv(comm: &SimpleCommunicator, from: usize) -> Result<HostVec> {
    let peer = comm.process_at_rank(from as i32);
    let mut header = [0u64; 2];
    peer.receive_into(&mut header[..]);
    let dtype = dtype_of(header[0]).ok_or_else(|| Error::Collective {
        op: "recv",
        rank: comm.rank() as usize,
        msg: format!("rank {from} sent a message of unknown dtype code {}", header[0]),
    })?;
    let mut host = zeros(dtype, header[1] as usize);
    peer.receive_into(bytes_mut(&mut host));
    Ok(host)
}
