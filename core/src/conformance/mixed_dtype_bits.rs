//! A backend's mixed-dtype fusions (`Backend::binary_mixed`, `layer_norm_last_to` and its
//! backward, `add_layer_norm_last_to`) against the casts and ops they stand for, on the same device. The contract asks
//! for their bits: a run takes whichever path its backend offers, and autocast's results must
//! not depend on which. The values include NaN, infinities and signed zeros.

use super::bias_act_bits::{bits, same_bits, values};
use crate::backend::{BinaryOp, BufferRef, InputGradient, LayerNormAffine, LayerNormSpec};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::{Layout, Shape};
use crate::tensor::Tensor;

/// Where `device`'s fused mixed-dtype ops differ from the composed ones, one line each, for an
/// f32 activation and a `half` (f16 or bf16) one: an add and a subtract with the half operand
/// broadcast along rows (each side first), a LayerNorm rounded to `half`, its gradients from a
/// `half` output gradient (the residual stream's gradient added and the total rounded to
/// `half`), and the residual add before a LayerNorm (a `half` branch, and all in f32). Rows past
/// the CPU's parallel threshold.
pub fn mixed_dtype_mismatches(device: &Device, half: DType) -> Result<Vec<String>> {
    let (rows, cols) = (600, 300);
    let wide = values(&[rows, cols], 1, DType::F32, device)?;
    let narrow_row = values(&[cols], 2, half, device)?;
    let grad = values(&[rows, cols], 3, half, device)?;
    // LayerNorm's statistics over a row with a NaN or an infinity are NaN; keep most rows finite.
    let x = Tensor::from_vec(
        (0..rows * cols).map(|i| ((i * 37) % 101) as f32 / 16.0 - 3.0).collect(),
        [rows, cols],
        device,
    )?;
    let weight = values(&[cols], 4, DType::F32, device)?;
    let bias = values(&[cols], 5, DType::F32, device)?;
    let backend = device.backend();
    let mut mismatches = Vec::new();
    let mut compare = |what: String, fused: &BufferRef, composed: &BufferRef| -> Result<()> {
        let as_tensor = |b: &BufferRef| Tensor::from_buffer(b.clone(), Shape::new(vec![b.len()]), device);
        let (f, c) = (bits(&as_tensor(fused))?, bits(&as_tensor(composed))?);
        if fused.dtype() != composed.dtype() {
            mismatches.push(format!(
                "{what}: {} fused, {} composed",
                fused.dtype(),
                composed.dtype()
            ));
        } else if let Some(at) = (0..f.len()).find(|&i| !same_bits(f[i], c[i])) {
            let value = |v: u64| f64::from_bits(v);
            mismatches.push(format!(
                "{what}: element {at} is {} fused, {} composed",
                value(f[at]),
                value(c[at])
            ));
        }
        Ok(())
    };

    let full = Layout::contiguous([rows, cols]);
    let along_rows = Layout::contiguous([cols]).broadcast_to("binary_mixed", &Shape::new(vec![rows, cols]))?;
    let widened_row = backend.cast(narrow_row.buffer(), &along_rows, DType::F32)?;
    for op in [BinaryOp::Add, BinaryOp::Sub] {
        for half_first in [false, true] {
            let ((a, la), (b, lb)) = ((wide.buffer(), &full), (narrow_row.buffer(), &along_rows));
            let (fused, composed) = if half_first {
                (
                    backend.binary_mixed(op, b, lb, a, la)?,
                    backend.binary(op, &widened_row, &full, a, la)?,
                )
            } else {
                (
                    backend.binary_mixed(op, a, la, b, lb)?,
                    backend.binary(op, a, la, &widened_row, &full)?,
                )
            };
            let order = if half_first { "half, f32" } else { "f32, half" };
            compare(
                format!("binary_mixed {} ({order}) {half}", op.name()),
                &fused,
                &composed,
            )?;
        }
    }

    let spec = LayerNormSpec { rows, cols, eps: 1e-5 };
    let affine = LayerNormAffine {
        weight: Some(weight.buffer()),
        bias: Some(bias.buffer()),
    };
    let fused = backend.layer_norm_last_to(x.buffer(), affine, &spec, half)?;
    let composed = backend.cast(&backend.layer_norm_last(x.buffer(), affine, &spec)?, &full, half)?;
    compare(format!("layer_norm_last_to {half}"), &fused, &composed)?;
    // The backward with the residual stream's gradient added and the total rounded to `half`.
    let accumulated = values(&[rows, cols], 6, DType::F32, device)?;
    let input = InputGradient {
        accumulated: Some(accumulated.buffer()),
        rounded: Some(half),
    };
    let fused = backend.layer_norm_last_to_backward(grad.buffer(), x.buffer(), affine, &spec, input)?;
    let wide_grad = backend.cast(grad.buffer(), &full, DType::F32)?;
    let composed = backend.layer_norm_last_backward(&wide_grad, x.buffer(), affine, &spec)?;
    let total = backend.binary(BinaryOp::Add, accumulated.buffer(), &full, &composed.input, &full)?;
    let parts = [
        ("input", Some(fused.input), Some(total.clone())),
        ("weight", fused.weight, composed.weight),
        ("bias", fused.bias, composed.bias),
        (
            "rounded input",
            fused.rounded_input,
            Some(backend.cast(&total, &full, half)?),
        ),
    ];
    for (what, f, c) in parts {
        let (Some(f), Some(c)) = (f, c) else {
            return Err(crate::error::Error::invalid(
                "layer_norm_last_to_backward",
                format!("returned no {what} gradient for a LayerNorm with one"),
            ));
        };
        compare(
            format!("layer_norm_last_to_backward {half}: the {what}'s gradient"),
            &f,
            &c,
        )?;
    }

    // The residual add before the LayerNorm: a 16-bit branch and its output in `half`, and
    // all in f32.
    let branch = values(&[rows, cols], 7, half, device)?;
    let wide_branch = backend.cast(branch.buffer(), &full, DType::F32)?;
    for (b, out) in [(branch.buffer(), half), (&wide_branch, DType::F32)] {
        let [sum, normed] = backend.add_layer_norm_last_to(x.buffer(), b, affine, &spec, out)?;
        let composed_sum = backend.binary(BinaryOp::Add, x.buffer(), &full, &wide_branch, &full)?;
        let composed = backend.layer_norm_last(&composed_sum, affine, &spec)?;
        let composed = if out == DType::F32 {
            composed
        } else {
            backend.cast(&composed, &full, out)?
        };
        let what = format!("add_layer_norm_last_to {} + {} to {out}", DType::F32, b.dtype());
        compare(format!("{what}: the sum"), &sum, &composed_sum)?;
        compare(format!("{what}: the normalised sum"), &normed, &composed)?;
    }
    Ok(mismatches)
}
