//! The cooperative-matrix product as SPIR-V of our own making, for Vulkan: naga translates
//! matmul_coop.wgsl as wgpu would, then `spirv_memory_model` makes its workgroup-memory
//! accesses non-private, and the backend hands the words to the driver as they are (wgpu's
//! passthrough shaders). Through wgpu's own translation the operands staged in workgroup memory
//! are private accesses under the Vulkan memory model naga declares for cooperative matrices,
//! which a driver may read before the barrier that should order them.

use crate::cooperative::Cooperative;
use crate::spirv_memory_model;

/// The entry point of matmul_coop.wgsl.
pub const ENTRY: &str = "matmul_coop";

/// The SPIR-V of matmul_coop.wgsl as composed for `shape` (`Cooperative::source`), its subgroup
/// size fixed (a passthrough module has no pipeline constants).
pub fn compile(shape: Cooperative, source: &str) -> Result<Vec<u32>, String> {
    translate(source, ENTRY, &[("SUBGROUP", f64::from(shape.subgroup))])
}

/// `entry` of the WGSL compute shader `source` as SPIR-V for Vulkan, its overridable `constants`
/// fixed and its workgroup-memory accesses non-private. For shaders that bound every index
/// themselves: no runtime checks are added.
pub fn translate(source: &str, entry: &str, constants: &[(&str, f64)]) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let constants: naga::back::PipelineConstants = constants.iter().map(|&(n, v)| (n.to_string(), v)).collect();
    let stage = naga::ShaderStage::Compute;
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, Some((stage, entry)), &constants)
            .map_err(|e| format!("its pipeline constants: {e}"))?;
    let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
    let options = naga::back::spv::Options {
        // Vulkan 1.1's SPIR-V; the cooperative-matrix and memory-model extensions are declared.
        lang_version: (1, 3),
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: unchecked,
            buffer: unchecked,
            image_load: unchecked,
            binding_array: unchecked,
        },
        force_loop_bounding: false,
        emit_int_div_checks: false,
        // The shaders write what they read of workgroup memory first.
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        use_storage_input_output_16: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: stage,
        entry_point: entry.into(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| e.to_string())?;
    let (words, _changed) = spirv_memory_model::workgroup_accesses_non_private(&words)?;
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cooperative::{TILES, Translation};

    /// `OpLoad`, `OpStore` and the cooperative loads and stores: (opcode, whether the access
    /// carries NonPrivatePointer) for each, in order.
    fn accesses(words: &[u32]) -> Vec<(u32, bool)> {
        let mut out = Vec::new();
        let mut at = 5;
        while at < words.len() {
            let (count, opcode) = ((words[at] >> 16) as usize, words[at] & 0xffff);
            let operands = &words[at + 1..at + count];
            let fixed = match opcode {
                61 => Some(3),
                62 => Some(2),
                4457 => Some(5),
                4458 => Some(4),
                _ => None,
            };
            if let Some(fixed) = fixed {
                out.push((opcode, operands.get(fixed).is_some_and(|mask| mask & 0x20 != 0)));
            }
            at += count;
        }
        out
    }

    #[test]
    fn every_shape_compiles_and_its_workgroup_accesses_become_non_private() {
        for (edge, subgroup) in [(16, 32), (8, 8)] {
            for tile in TILES {
                for t in ["f32", "f16", "bf16"] {
                    let shape = Cooperative {
                        edge,
                        subgroup,
                        tile,
                        translation: Translation::OwnSpirv,
                    };
                    let words = compile(shape, &shape.source(&[t])).unwrap_or_else(|e| panic!("{shape:?} {t}: {e}"));
                    let found = accesses(&words);
                    let cooperative = |op| found.iter().filter(|&&(o, _)| o == op).collect::<Vec<_>>();
                    // A matrix of each operand per fragment row (column) a step, a store of each
                    // accumulator through workgroup memory: every one of them non-private.
                    let frags = tile.frags as usize;
                    assert_eq!(cooperative(4457).len(), 2 * frags, "{shape:?} {t}");
                    assert_eq!(cooperative(4458).len(), frags * frags, "{shape:?} {t}");
                    assert!(cooperative(4457).iter().chain(&cooperative(4458)).all(|&&(_, np)| np));
                    // Plain loads and stores: the workgroup ones changed, the storage and
                    // function-local ones not.
                    assert!(found.iter().any(|&(op, np)| op == 61 && np));
                    assert!(found.iter().any(|&(op, np)| op == 62 && np));
                    assert!(found.iter().any(|&(op, np)| op == 61 && !np));
                }
            }
        }
    }

    #[test]
    fn the_subgroup_size_is_fixed_in_the_workgroup_size() {
        let shape = Cooperative {
            edge: 16,
            subgroup: 32,
            tile: TILES[0],
            translation: Translation::OwnSpirv,
        };
        let words = compile(shape, &shape.source(&["f16"])).unwrap();
        // OpExecutionMode %entry LocalSize x y z: opcode 16, mode 17.
        let local_size = words
            .windows(6)
            .find(|w| w[0] == (6 << 16 | 16) && w[2] == 17)
            .map(|w| (w[3], w[4], w[5]));
        assert_eq!(local_size, Some((128, 1, 1)));
    }
}
