//! Explicit bind group layouts, read from each shader's own declarations. wgpu's automatic
//! layouts cannot bind the parameter arena (binding 0) at a dynamic offset, and an arena bound
//! at a fixed offset would make every dispatch's bind group a new one.

use std::num::NonZeroU64;

use wgpu::naga;

/// Bytes of the arena that binding 0 exposes to one dispatch: the most parameters a dispatch may
/// carry. It costs nothing: the arena only has to extend this far past the last dispatch's offset.
pub const PARAMS_WINDOW: u64 = 4096;

/// A storage buffer an entry point uses: (binding, read-only), ordered by binding.
pub type StorageBindings = Vec<(u32, bool)>;

/// The storage bindings of group 0 that entry point `entry` of the WGSL `source` uses (what an
/// automatic layout would hold), or why they could not be read.
pub fn storage_bindings(source: &str, entry: &str) -> Result<StorageBindings, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| format!("the shader has no entry point `{entry}`"))?;
    let uses = info.get_entry_point(index);
    let mut bindings: StorageBindings = module
        .global_variables
        .iter()
        .filter(|&(handle, _)| !uses[handle].is_empty())
        .filter_map(|(_, var)| match (var.space, &var.binding) {
            (naga::AddressSpace::Storage { access }, Some(b)) if b.group == 0 => {
                Some((b.binding, !access.contains(naga::StorageAccess::STORE)))
            }
            _ => None,
        })
        .collect();
    bindings.sort_unstable();
    Ok(bindings)
}

/// The layout entries for `bindings`: the arena window at binding 0 (always, at a dynamic
/// offset) and every other buffer bound whole.
pub fn layout_entries(bindings: &[(u32, bool)]) -> Vec<wgpu::BindGroupLayoutEntry> {
    let entry = |binding, read_only, has_dynamic_offset, min_binding_size| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset,
            min_binding_size,
        },
        count: None,
    };
    let params = entry(0, true, true, NonZeroU64::new(PARAMS_WINDOW));
    let buffers = bindings
        .iter()
        .filter(|&&(binding, _)| binding != 0)
        .map(|&(binding, read_only)| entry(binding, read_only, false, None));
    std::iter::once(params).chain(buffers).collect()
}

#[cfg(test)]
mod tests {
    use super::storage_bindings;

    fn source(name: &str, types: &[&str]) -> String {
        lockstep_shaders::compose(lockstep_shaders::shader(name).expect("a shader"), types)
    }

    #[test]
    fn an_entry_point_gets_exactly_the_bindings_it_uses() {
        let binary = source("binary", &["f32"]);
        assert_eq!(
            storage_bindings(&binary, "binary").unwrap(),
            [(0, true), (1, true), (2, true), (3, false)]
        );
        // compare.wgsl declares f32 and i64 operands; each entry point uses one pair.
        let compare = source("compare", &["f32"]);
        assert_eq!(
            storage_bindings(&compare, "compare").unwrap(),
            [(0, true), (1, true), (2, true), (3, false)]
        );
        assert_eq!(
            storage_bindings(&compare, "compare_i64").unwrap(),
            [(0, true), (3, false), (4, true), (5, true)]
        );
    }

    #[test]
    fn a_missing_entry_point_or_a_broken_shader_is_an_error() {
        let unary = source("unary", &["f32"]);
        assert!(storage_bindings(&unary, "nope").unwrap_err().contains("nope"));
        assert!(storage_bindings(&source("unary", &["no_such_type"]), "unary").is_err());
    }
}
