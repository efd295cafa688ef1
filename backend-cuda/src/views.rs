//! Kernel parameters describing strided operands (`Shape`, `View`, `SubShape` in prelude.cuh),
//! built from core layouts, with dimensions merged where every operand is contiguous across
//! them, so a contiguous tensor reaches the kernel as rank 1.

use cudarc::driver::DeviceRepr;

use lockstep_core::shape::{Layout, MergedDims};
use lockstep_core::{Error, Result};

pub(crate) const MAX_RANK: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Shape {
    pub n: u32,
    pub rank: u32,
    pub dims: [u32; MAX_RANK],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct View {
    pub offset: u32,
    pub strides: [u32; MAX_RANK],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SubShape {
    pub rank: u32,
    pub dims: [u32; MAX_RANK],
    pub strides: [u32; MAX_RANK],
}

// SAFETY: plain #[repr(C)] structs of u32, laid out exactly as their C twins in prelude.cuh and
// reduce.cu (4-byte aligned, no padding), passed to kernels by value.
unsafe impl DeviceRepr for Shape {}
// SAFETY: as above.
unsafe impl DeviceRepr for View {}
// SAFETY: as above.
unsafe impl DeviceRepr for SubShape {}

/// The largest element count, offset or index the kernels may see. Kernels index in u32, and a
/// grid-stride loop's last step (`i += blockDim * gridDim`, at most 2^26 threads: 256 per block,
/// 32 blocks per SM, up to 8192 SMs) must not wrap `i` past 2^32, where it would loop forever.
pub(crate) const MAX_INDEX: usize = u32::MAX as usize - (1 << 26);

pub(crate) fn to_u32(op: &'static str, x: usize) -> Result<u32> {
    if x > MAX_INDEX {
        return Err(too_large(op, x));
    }
    Ok(x as u32)
}

/// Every buffer is at most `MAX_INDEX` elements, so no index into one (nor a product such as
/// `row * cols` below its length) overflows a kernel's u32 arithmetic.
pub(crate) fn check_len(op: &'static str, len: usize) -> Result<()> {
    if len > MAX_INDEX {
        return Err(too_large(op, len));
    }
    Ok(())
}

fn too_large(op: &'static str, x: usize) -> Error {
    Error::invalid(
        op,
        format!(
            "{x} elements or offsets exceed the CUDA kernels' 32-bit indexing (at most {MAX_INDEX}); split the tensor"
        ),
    )
}

/// One shape and a view per operand, all layouts of the same shape, dimensions merged.
pub(crate) fn strided(op: &'static str, layouts: &[&Layout]) -> Result<(Shape, Vec<View>)> {
    let merged = MergedDims::new(layouts);
    if merged.dims.len() > MAX_RANK {
        return Err(Error::invalid(
            op,
            format!("the CUDA backend handles views of up to {MAX_RANK} non-contiguous dimensions"),
        ));
    }
    let mut shape = Shape {
        n: to_u32(op, layouts[0].elem_count())?,
        rank: merged.dims.len() as u32,
        ..Default::default()
    };
    for (d, &size) in merged.dims.iter().enumerate() {
        shape.dims[d] = to_u32(op, size)?;
    }
    let mut views = Vec::with_capacity(layouts.len());
    for (layout, strides) in layouts.iter().zip(&merged.strides) {
        let mut view = View {
            offset: to_u32(op, layout.offset)?,
            ..Default::default()
        };
        for (d, &stride) in strides.iter().enumerate() {
            view.strides[d] = to_u32(op, stride)?;
        }
        views.push(view);
    }
    Ok((shape, views))
}

/// A sub-shape (some of a layout's axes) for the reduction kernel.
pub(crate) fn sub_shape(op: &'static str, dims: &[usize], strides: &[usize]) -> Result<SubShape> {
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(op, format!("at most {MAX_RANK} axes on CUDA")));
    }
    let mut s = SubShape {
        rank: dims.len() as u32,
        ..Default::default()
    };
    for (d, (&size, &stride)) in dims.iter().zip(strides).enumerate() {
        s.dims[d] = to_u32(op, size)?;
        s.strides[d] = to_u32(op, stride)?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_past_the_grid_stride_headroom_are_refused() {
        assert_eq!(to_u32("t", MAX_INDEX).unwrap(), MAX_INDEX as u32);
        // The last step of a grid-stride loop from the largest index stays below 2^32.
        assert!((MAX_INDEX as u64) + (1 << 26) <= u64::from(u32::MAX));
        let err = to_u32("t", MAX_INDEX + 1).unwrap_err().to_string();
        assert!(err.contains("32-bit indexing") && err.contains("split"), "{err}");
        assert!(
            to_u32("t", u32::MAX as usize).is_err(),
            "the old bound let this through"
        );
        assert!(check_len("t", MAX_INDEX).is_ok());
        assert!(check_len("t", MAX_INDEX + 1).is_err());
    }

    #[test]
    fn contiguous_tensors_become_rank_one() {
        let l = Layout::contiguous([4, 5, 6]);
        let (shape, views) = strided("t", &[&l, &l]).unwrap();
        assert_eq!((shape.n, shape.rank, shape.dims[0]), (120, 1, 120));
        assert_eq!(views[1].strides[0], 1);
    }

    #[test]
    fn a_transpose_keeps_two_dimensions_and_broadcasts_keep_zero_strides() {
        let t = Layout {
            shape: lockstep_core::Shape::new([3, 4]),
            strides: vec![1, 3],
            offset: 2,
        };
        let b = Layout {
            shape: lockstep_core::Shape::new([3, 4]),
            strides: vec![0, 1],
            offset: 0,
        };
        let (shape, views) = strided("t", &[&t, &b]).unwrap();
        assert_eq!((shape.rank, &shape.dims[..2]), (2, &[3u32, 4][..]));
        assert_eq!((views[0].offset, &views[0].strides[..2]), (2, &[1u32, 3][..]));
        assert_eq!(&views[1].strides[..2], &[0u32, 1]);
    }

    #[test]
    fn size_one_dimensions_vanish_and_a_scalar_has_rank_zero() {
        let l = Layout::contiguous([1, 1]);
        let (shape, _) = strided("t", &[&l]).unwrap();
        assert_eq!((shape.n, shape.rank), (1, 0));
    }
}
