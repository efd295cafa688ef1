//! Every shader, in every element type it accepts, parses and validates with naga: the same
//! front end wgpu runs before any driver sees the code.

use super::*;
use naga::valid::{Capabilities, ValidationFlags, Validator};

fn validate(source: &str) -> Result<naga::Module, String> {
    validate_with(source, Capabilities::SHADER_FLOAT16)
}

fn validate_with(source: &str, capabilities: Capabilities) -> Result<naga::Module, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    Validator::new(ValidationFlags::all(), capabilities)
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    Ok(module)
}

/// Every assignment of the shader's element types to its aliases.
fn instantiations(shader: &Shader) -> Vec<Vec<&'static str>> {
    let mut all = vec![vec![]];
    for _ in shader.aliases {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                shader.types.iter().map(move |t| {
                    let mut v = prefix.clone();
                    v.push(*t);
                    v
                })
            })
            .collect();
    }
    all
}

#[test]
fn every_shader_validates_in_every_element_type() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for shader in SHADERS {
        for types in instantiations(shader) {
            match validate(&compose(shader, &types)) {
                Ok(module) => {
                    let found: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
                    if found != shader.entry_points {
                        failures.push(format!(
                            "{}: entry points {found:?}, declared {:?}",
                            shader.name, shader.entry_points
                        ));
                    }
                    checked += 1;
                }
                Err(e) => failures.push(format!("{} with {types:?}:\n{e}", shader.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(checked >= SHADERS.len());
}

#[test]
fn every_wgsl_file_is_registered() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/wgsl");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let stem = name.trim_end_matches(".wgsl");
        assert!(
            stem == "common" || stem == MATMUL_COOP.name || shader(stem).is_some(),
            "{name} is not in SHADERS"
        );
    }
}

#[test]
fn a_broken_shader_is_reported_with_its_line() {
    let broken = Shader {
        name: "broken",
        source: "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }",
        aliases: &[],
        types: &[],
        entry_points: &["main"],
    };
    let err = validate(&compose(&broken, &[])).unwrap_err();
    assert!(err.contains("1.5") || err.contains("u32"), "{err}");
}

#[test]
fn half_precision_needs_the_capability() {
    let source = compose(shader("unary").unwrap(), &["f16"]);
    let module = naga::front::wgsl::parse_str(&source).unwrap();
    let without = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module);
    assert!(without.is_err(), "f16 validated without SHADER_FLOAT16");
}

#[test]
fn the_cooperative_product_validates_for_each_edge_and_element_type() {
    let capabilities = Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
    let mut failures = Vec::new();
    for edge in [8, 16] {
        for (grid, frags) in [(1, 2), (2, 2), (2, 4)] {
            for types in instantiations(&MATMUL_COOP) {
                let source = compose_cooperative(edge, grid, frags, &types);
                assert!(!source.contains("//@"), "a placeholder left in the composed source");
                match validate_with(&source, capabilities) {
                    Ok(module) => assert_eq!(module.entry_points[0].name, "matmul_coop"),
                    Err(e) => failures.push(format!("edge {edge}, grid {grid}, frags {frags}, {types:?}:\n{e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Without the capability naga refuses it: the test above is not passing vacuously.
    assert!(validate(&compose_cooperative(16, 2, 2, &["f16"])).is_err());
}
