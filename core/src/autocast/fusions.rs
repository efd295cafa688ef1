//! Whether autocast takes a device's mixed-dtype fusions (`Backend::layer_norm_last_to` for a
//! LayerNorm feeding a product, `Backend::binary_mixed` for the f32 residual stream plus a 16-bit
//! branch) or the casts and ops they stand for. The fusions must give the same bits; at their
//! first use on a device and dtype they are checked against the composed ops
//! (`conformance::mixed_dtype_mismatches`) and, where they disagree, autocast composes there,
//! saying so in one line. `LOCKSTEP_AUTOCAST_FUSIONS=off` (read once) composes everywhere, to
//! compare.

use std::sync::{Mutex, OnceLock};

use crate::device::Device;
use crate::dtype::DType;

/// Whether `LOCKSTEP_AUTOCAST_FUSIONS=off` composes every fusion (read once). LayerNorm's
/// backward then leaves the residual stream's gradient to the autograd walk's add as well.
pub(crate) fn switched_off() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| match std::env::var("LOCKSTEP_AUTOCAST_FUSIONS").as_deref() {
        Ok("off") => true,
        Ok("on") | Err(_) => false,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_AUTOCAST_FUSIONS={other:?} is neither \"on\" nor \"off\"; ignored");
            false
        }
    })
}

/// Whether autocast may take `device`'s fusions for the 16-bit dtype `half`.
pub(crate) fn fusions_on(device: &Device, half: DType) -> bool {
    if switched_off() {
        return false;
    }
    // Each device and dtype checked so far, with the verdict: a few entries, searched by the
    // device's own equality (no key to build on every op).
    static CHECKED: Mutex<Vec<(Device, DType, bool)>> = Mutex::new(Vec::new());
    let verdict = |checked: &[(Device, DType, bool)]| {
        checked
            .iter()
            .find(|(d, h, _)| d == device && *h == half)
            .map(|&(_, _, on)| on)
    };
    if let Some(on) = verdict(&CHECKED.lock().unwrap_or_else(|e| e.into_inner())) {
        return on;
    }
    // Checked outside the lock: the check itself runs ops (and a thread of another device may
    // be checking too). Two threads of one device may both check; they agree.
    let on = match crate::conformance::mixed_dtype_mismatches(device, half) {
        Ok(mismatches) if mismatches.is_empty() => true,
        Ok(mismatches) => {
            eprintln!(
                "lockstep: {device}'s mixed-dtype fusions for {half} disagree with the casts they stand for ({}); \
                 autocast composes them there",
                mismatches[0]
            );
            false
        }
        Err(e) => {
            eprintln!(
                "lockstep: {device}'s mixed-dtype fusions for {half} could not be checked ({e}); autocast composes them there"
            );
            false
        }
    };
    CHECKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((device.clone(), half, on));
    on
}
