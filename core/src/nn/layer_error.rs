//! Errors that name the failing layer: `fc1: Linear: shapes [4, 2048] and [128, 1568] …`. A
//! layer cannot know its own name (the field holding it gives it), so it tags its error with the
//! id of one of its tensors, and the model around it (a `#[derive(Module)]` struct's `forward`,
//! a `Sequential`) looks that tensor up among its named ones.

use super::module::Module;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `result`, its error marked as raised by the layer that holds `tensor` (one of its parameters
/// or buffers); an error already marked by a layer inside keeps that layer.
pub(crate) fn raised_by<T>(result: Result<T>, tensor: &Tensor) -> Result<T> {
    result.map_err(|error| match error {
        Error::InLayer { .. } => error,
        other => Error::InLayer {
            layer: None,
            parameter: tensor.id(),
            error: Box::new(other),
        },
    })
}

/// `error` with the failing layer named as `model` names it (`fc1`, `blocks.0.fc`), when the
/// layer is inside `model`; otherwise unchanged. An outer model renames with its longer name.
/// The code `#[derive(Module)]` writes calls it on its `forward`'s errors.
pub fn name_failing_layer(model: &dyn Module, error: Error) -> Error {
    let Error::InLayer {
        layer,
        parameter,
        error,
    } = error
    else {
        return error;
    };
    let mut found = None;
    model.visit_state("", &mut |name, t| {
        if found.is_none() && t.id() == parameter {
            found = Some(name);
        }
    });
    // `fc1.weight` is `fc1`'s: the layer's name is the tensor's without its last part.
    let named = found.and_then(|name| name.rsplit_once('.').map(|(layer, _)| layer.to_string()));
    Error::InLayer {
        layer: named.or(layer),
        parameter,
        error,
    }
}
