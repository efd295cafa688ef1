//! The host side of MPI collectives: reductions of staged vectors in the MPI library (16-bit
//! floats widened to f32), and the raw bytes that broadcasts and gathers move unchanged.

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::Equivalence;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::CommunicatorCollectives as _;
use half::{bf16, f16};

use lockstep_core::backend::ReduceOp;
use lockstep_core::dtype::{DType, HostVec};
use lockstep_core::map_host_vec;

/// Reduces `host` (world equal chunks) across ranks and returns this rank's chunk, finished
/// (Mean divided by the world, truncating for integers as `LocalCommunicator` does; f16/bf16
/// reduced in f32 and rounded back once).
pub(super) fn reduce_chunk(comm: &SimpleCommunicator, host: &HostVec, op: ReduceOp, world: usize) -> HostVec {
    let system = match op {
        ReduceOp::Max => SystemOperation::max(),
        ReduceOp::Sum | ReduceOp::Mean => SystemOperation::sum(),
    };
    let mean = op == ReduceOp::Mean;
    let f32_mean = |x: f32| if mean { x / world as f32 } else { x };
    match host {
        HostVec::F32(v) => HostVec::F32(scatter(comm, v, system, world, f32_mean)),
        HostVec::F64(v) => HostVec::F64(scatter(
            comm,
            v,
            system,
            world,
            |x| if mean { x / world as f64 } else { x },
        )),
        HostVec::I64(v) => HostVec::I64(scatter(
            comm,
            v,
            system,
            world,
            |x| if mean { x / world as i64 } else { x },
        )),
        HostVec::U32(v) => HostVec::U32(scatter(
            comm,
            v,
            system,
            world,
            |x| if mean { x / world as u32 } else { x },
        )),
        HostVec::F16(v) => {
            let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            HostVec::F16(scatter(comm, &wide, system, world, |x| f16::from_f32(f32_mean(x))))
        }
        HostVec::BF16(v) => {
            let wide: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            HostVec::BF16(scatter(comm, &wide, system, world, |x| bf16::from_f32(f32_mean(x))))
        }
    }
}

/// `MPI_Reduce_scatter_block` of `values` (world equal chunks) with `finish` applied to this
/// rank's reduced chunk.
fn scatter<W: Equivalence + Copy + Default, T>(
    comm: &SimpleCommunicator,
    values: &[W],
    op: SystemOperation,
    world: usize,
    finish: impl Fn(W) -> T,
) -> Vec<T> {
    let mut chunk = vec![W::default(); values.len() / world];
    comm.reduce_scatter_block_into(values, &mut chunk[..], op);
    chunk.into_iter().map(finish).collect()
}

/// Broadcasts and gathers move bytes: every dtype travels unchanged, 16-bit floats included.
pub(super) fn bytes(v: &HostVec) -> &[u8] {
    map_host_vec!(v, v => bytemuck::cast_slice(v.as_slice()))
}

pub(super) fn bytes_mut(v: &mut HostVec) -> &mut [u8] {
    map_host_vec!(v, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
}

pub(super) fn zeros(dtype: DType, len: usize) -> HostVec {
    match dtype {
        DType::F32 => HostVec::F32(vec![0.0; len]),
        DType::F16 => HostVec::F16(vec![f16::ZERO; len]),
        DType::BF16 => HostVec::BF16(vec![bf16::ZERO; len]),
        DType::F64 => HostVec::F64(vec![0.0; len]),
        DType::I64 => HostVec::I64(vec![0; len]),
        DType::U32 => HostVec::U32(vec![0; len]),
    }
}
