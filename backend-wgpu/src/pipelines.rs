//! Compiles each shader variant once: a variant is a shader entry point, the element types bound
//! to its aliases, and its pipeline constants (the op of a unary, the kind of a reduction).
//! Only what compiled is cached: a failure (a validation error, a driver's compiler refusing the
//! translated shader, out of memory) is returned, and the next request tries again.
//!
//! Pipelines get explicit layouts (see `bind_layout`), one per distinct set of bindings, so
//! pipelines that bind alike share a bind group layout and with it their cached bind groups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use lockstep_core::Result;

use crate::bind_layout::{self, StorageBindings};
use crate::cooperative::{Cooperative, Tile, Translation};
use crate::cooperative_spirv;
use crate::gpu::Gpu;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub shader: &'static str,
    pub entry: &'static str,
    pub types: Vec<&'static str>,
    /// Pipeline-overridable constants as (name, value bits).
    pub constants: Vec<(&'static str, u64)>,
}

impl Variant {
    pub fn new(shader: &'static str, entry: &'static str, types: &[&'static str]) -> Variant {
        Variant {
            shader,
            entry,
            types: types.to_vec(),
            constants: vec![],
        }
    }
    pub fn constant(mut self, name: &'static str, value: f64) -> Variant {
        self.constants.push((name, value.to_bits()));
        self
    }
    /// `shader/entry` with its element types and constants: `bias_act/bias_act bf16 ACT=9`.
    pub fn name(&self) -> String {
        let mut name = format!("{}/{}", self.shader, self.entry);
        for t in &self.types {
            name += &format!(" {t}");
        }
        for &(constant, bits) in &self.constants {
            name += &format!(" {constant}={}", f64::from_bits(bits));
        }
        name
    }
}

/// A shader with its aliases bound: one compiled module.
type ModuleKey = (&'static str, Vec<&'static str>);

/// A compiled module and the WGSL it came from (read again for each entry point's bindings).
struct Module {
    compiled: wgpu::ShaderModule,
    source: String,
    /// Whether its pipeline constants were fixed when it was compiled (passthrough SPIR-V takes
    /// none from the pipeline).
    constants_fixed: bool,
}

/// The layouts of pipelines that bind the same buffers the same way.
#[derive(Clone)]
struct Layouts {
    bind_group: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
}

/// A compute pipeline and the layout its bind groups are made for.
#[derive(Debug)]
pub struct Pipeline {
    /// The variant's name, for error messages and kernel profiles.
    pub label: String,
    pub compute: wgpu::ComputePipeline,
    pub bind_group_layout: wgpu::BindGroupLayout,
}

#[derive(Default)]
pub struct Pipelines {
    cache: Mutex<HashMap<Variant, Arc<Pipeline>>>,
    modules: Mutex<HashMap<ModuleKey, Arc<Module>>>,
    layouts: Mutex<HashMap<StorageBindings, Layouts>>,
}

impl Pipelines {
    pub fn get(&self, gpu: &Gpu, variant: &Variant) -> Result<Arc<Pipeline>> {
        if let Some(p) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(variant) {
            return Ok(p.clone());
        }
        let module = self.module(gpu, variant)?;
        let constants: Vec<(&str, f64)> = match module.constants_fixed {
            true => vec![],
            false => variant.constants.iter().map(|&(n, v)| (n, f64::from_bits(v))).collect(),
        };
        let what = format!(
            "building the {}/{} pipeline for {:?} on this driver",
            variant.shader, variant.entry, variant.types
        );
        let bindings = bind_layout::storage_bindings(&module.source, variant.entry)
            .map_err(|e| gpu.error(format!("{what}: {e}")))?;
        let layouts = self.layouts(gpu, &what, bindings)?;
        let pipeline = gpu.scoped(&what, || {
            gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(variant.entry),
                layout: Some(&layouts.pipeline),
                module: &module.compiled,
                entry_point: Some(variant.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    // Every shader writes what it reads of workgroup memory first.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })?;
        let pipeline = Arc::new(Pipeline {
            label: variant.name(),
            compute: pipeline,
            bind_group_layout: layouts.bind_group,
        });
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(variant.clone(), pipeline.clone());
        Ok(pipeline)
    }

    /// The layouts for pipelines with `bindings`, made on first use.
    fn layouts(&self, gpu: &Gpu, what: &str, bindings: StorageBindings) -> Result<Layouts> {
        if let Some(l) = self.layouts.lock().unwrap_or_else(|p| p.into_inner()).get(&bindings) {
            return Ok(l.clone());
        }
        let layouts = gpu.scoped(what, || {
            let bind_group = gpu.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &bind_layout::layout_entries(&bindings),
            });
            let pipeline = gpu.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&bind_group)],
                immediate_size: 0,
            });
            Layouts { bind_group, pipeline }
        })?;
        self.layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(bindings, layouts.clone());
        Ok(layouts)
    }

    fn module(&self, gpu: &Gpu, variant: &Variant) -> Result<Arc<Module>> {
        let key = (variant.shader, variant.types.clone());
        if let Some(m) = self.modules.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(m.clone());
        }
        let source = match (variant.shader, gpu.cooperative, multi_tensor_source(variant)) {
            (_, _, Some(source)) => source,
            ("matmul_coop", Some(shape), None) => {
                // The variant's types: the element type, then the tile's name.
                let name = variant.types.get(1).copied().unwrap_or_default();
                let tile = Tile::named(name).ok_or_else(|| gpu.error(format!("no cooperative tile {name:?}")))?;
                let shape = Cooperative { tile, ..shape };
                let source = shape.source(&variant.types[..1]);
                if shape.translation == Translation::OwnSpirv {
                    return Ok(self.insert(key, Self::own_spirv(gpu, shape, source)?));
                }
                source
            }
            ("matmul_coop", None, None) => {
                return Err(gpu.error("this device was opened without cooperative matrices"));
            }
            (name, _, None) => {
                let shader =
                    lockstep_shaders::shader(name).ok_or_else(|| gpu.error(format!("no shader named {name}")))?;
                lockstep_shaders::compose(shader, &variant.types)
            }
        };
        let what = format!("compiling {}.wgsl for {:?}", variant.shader, variant.types);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(variant.shader),
            source: wgpu::ShaderSource::Wgsl(source.as_str().into()),
        };
        let compiled = gpu.scoped(&what, || {
            if runs_unchecked(variant.shader) {
                // SAFETY: the shaders `runs_unchecked` names clamp every index they read into
                // their buffers and guard every write by the output's shape, so the checks
                // wgpu would add (index clamps, loop bounds) only cost time.
                unsafe {
                    gpu.device
                        .create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
                }
            } else {
                gpu.device.create_shader_module(descriptor)
            }
        })?;
        let module = Module {
            compiled,
            source,
            constants_fixed: false,
        };
        Ok(self.insert(key, module))
    }

    fn insert(&self, key: ModuleKey, module: Module) -> Arc<Module> {
        let module = Arc::new(module);
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, module.clone());
        module
    }

    /// matmul_coop.wgsl as composed for `shape` (`source`) as our SPIR-V (`cooperative_spirv`),
    /// handed to the driver as is. wgpu adds no runtime checks to it, whatever
    /// `LOCKSTEP_WGPU_CHECKS` says.
    fn own_spirv(gpu: &Gpu, shape: Cooperative, source: String) -> Result<Module> {
        let what = format!("compiling matmul_coop.wgsl ({}) to SPIR-V", shape.describe());
        let words = cooperative_spirv::compile(shape, &source).map_err(|e| gpu.error(format!("{what}: {e}")))?;
        let compiled = gpu.scoped(&what, || {
            // SAFETY: the words are naga's own translation of a validated WGSL module (its
            // bindings, which the explicit layout matches, and its workgroup size fixed for this
            // adapter's subgroup), changed only in the memory operands of its workgroup-memory
            // accesses; the shader clamps every index it reads, like the modules `runs_unchecked`
            // names.
            unsafe {
                gpu.device
                    .create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                        label: Some("matmul_coop"),
                        entry_points: vec![wgpu::PassthroughShaderEntryPoint {
                            name: cooperative_spirv::ENTRY.into(),
                            workgroup_size: (shape.invocations(), 1, 1),
                        }]
                        .into(),
                        spirv: Some(words.into()),
                        ..Default::default()
                    })
            }
        })?;
        Ok(Module {
            compiled,
            source,
            constants_fixed: true,
        })
    }
}

/// The source of a multi-tensor shader (lockstep_shaders::multi_tensor), whose variant's one
/// type names the tensors a dispatch takes; `None` for the other shaders.
fn multi_tensor_source(variant: &Variant) -> Option<String> {
    let k = variant.types.first()?.parse().ok()?;
    lockstep_shaders::multi_tensor::compose_multi_tensor(variant.shader, k)
}

/// The shaders that bound every index themselves: the products, whose inner loops wgpu's
/// index clamps and loop bounding would otherwise slow. `LOCKSTEP_WGPU_CHECKS=all` (read once)
/// keeps wgpu's checks on them too, to rule them out when a result looks wrong.
const SELF_BOUNDED: [&str; 3] = ["matmul", "matmul_coop", "conv_gemm"];

fn runs_unchecked(shader: &str) -> bool {
    static ALL_CHECKED: OnceLock<bool> = OnceLock::new();
    let all_checked = *ALL_CHECKED.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_CHECKS").as_deref() {
        Ok("all") => true,
        Ok(other) => {
            eprintln!("lockstep: LOCKSTEP_WGPU_CHECKS={other:?} is not \"all\"; ignored");
            false
        }
        Err(_) => false,
    });
    !all_checked && SELF_BOUNDED.contains(&shader)
}

#[cfg(test)]
mod tests {
    use super::{Pipelines, Variant};
    use crate::gpu::Gpu;

    /// A device on the first adapter, or None (saying why) where there is none and CI expects none.
    fn gpu() -> Option<Gpu> {
        let Some(adapter) = crate::provider::adapter(0) else {
            assert!(
                std::env::var("LOCKSTEP_EXPECT_WGPU").as_deref() != Ok("1"),
                "LOCKSTEP_EXPECT_WGPU=1 but wgpu found no adapter"
            );
            eprintln!("*** SKIPPED: no wgpu adapter ***");
            return None;
        };
        Some(Gpu::open("wgpu:0 (unit test)".into(), adapter, adapter.limits()).expect("the adapter opens"))
    }

    fn cached(pipelines: &Pipelines) -> (usize, usize) {
        let pipelines_cached = pipelines.cache.lock().map(|c| c.len()).unwrap_or_default();
        let modules_cached = pipelines.modules.lock().map(|m| m.len()).unwrap_or_default();
        (pipelines_cached, modules_cached)
    }

    /// Requests `broken` twice: each time an error naming `expected` and no pipeline cached, and
    /// the device left usable.
    fn assert_fails_uncached(gpu: &Gpu, pipelines: &Pipelines, broken: &Variant, expected: &str) {
        for attempt in 1..=2 {
            let err = pipelines.get(gpu, broken).expect_err("a broken variant").to_string();
            assert!(
                err.contains(expected) && err.contains("wgpu:0"),
                "attempt {attempt}: {err}"
            );
            assert_eq!(cached(pipelines).0, 0, "attempt {attempt} cached a failed pipeline");
        }
        gpu.check().expect("a caught error leaves the device usable");
        let fine = Variant::new("unary", "unary", &["f32"]);
        pipelines.get(gpu, &fine).expect("the device still builds pipelines");
    }

    #[test]
    fn a_pipeline_that_fails_to_build_is_an_error_and_is_not_cached() {
        let Some(gpu) = gpu() else { return };
        let pipelines = Pipelines::default();
        let broken = Variant::new("unary", "no_such_entry", &["f32"]);
        assert_fails_uncached(&gpu, &pipelines, &broken, "unary/no_such_entry");
        assert_eq!(cached(&pipelines).0, 1, "only the working pipeline is cached");
    }

    #[test]
    fn a_shader_that_fails_to_compile_is_an_error_and_is_not_cached() {
        let Some(gpu) = gpu() else { return };
        let pipelines = Pipelines::default();
        let broken = Variant::new("unary", "unary", &["no_such_type"]);
        assert_fails_uncached(&gpu, &pipelines, &broken, "compiling unary.wgsl");
        assert_eq!(cached(&pipelines), (1, 1), "only the working variant is cached");
    }
}
