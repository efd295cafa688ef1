//! reduce (reduce.wgsl): sum, max, min and argmax over any set of axes of a strided tensor.

use lockstep_core::backend::{BufferRef, ReduceKind};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

impl WgpuBackend {
    pub(crate) fn reduce_axes(
        &self,
        kind: ReduceKind,
        src: &BufferRef,
        layout: &Layout,
        axes: &[usize],
    ) -> Result<BufferRef> {
        let op = kind.name();
        let src = self.operand(op, src, Some(layout))?;
        let t = self.float_type(op, src.dtype())?;
        let rank = layout.shape.rank();
        if axes.iter().any(|&a| a >= rank) || axes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::invalid(
                op,
                format!("axes {axes:?} must be sorted, unique and below rank {rank}"),
            ));
        }
        if kind == ReduceKind::ArgMax && axes.len() != 1 {
            return Err(Error::invalid(op, "argmax reduces exactly one axis"));
        }
        // Kept and reduced sub-shapes, each as sizes then strides.
        let (mut kept, mut reduced) = ((vec![], vec![]), (vec![], vec![]));
        for (axis, (&d, &s)) in layout.dims().iter().zip(&layout.strides).enumerate() {
            let part = if axes.contains(&axis) { &mut reduced } else { &mut kept };
            part.0.push(to_u32(op, d)?);
            part.1.push(to_u32(op, s)?);
        }
        let n_out: usize = layout
            .dims()
            .iter()
            .enumerate()
            .filter(|(a, _)| !axes.contains(a))
            .map(|(_, &d)| d)
            .product();
        let n_red: usize = axes.iter().map(|&a| layout.dims()[a]).product();
        let mut params = vec![
            to_u32(op, n_out)?,
            kept.0.len() as u32,
            to_u32(op, n_red)?,
            reduced.0.len() as u32,
            to_u32(op, layout.offset)?,
        ];
        params.extend(kept.0.iter().chain(&kept.1).chain(&reduced.0).chain(&reduced.1));
        let (entry, out_dtype, binding) = match kind {
            ReduceKind::ArgMax => ("argmax", DType::U32, 3),
            _ => ("reduce", src.dtype(), 2),
        };
        let kind_index = ReduceKind::ALL.iter().position(|k| *k == kind).expect("in ALL") as f64;
        let out = self.alloc(out_dtype, n_out)?;
        self.launch(
            &Variant::new("reduce", entry, &[t]).constant("KIND", kind_index),
            &params,
            &[(1, src), (binding, &out)],
            self.groups(op, n_out)?,
        )?;
        Ok(out)
    }
}
