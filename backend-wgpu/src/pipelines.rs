//! Compiles each shader variant once: a variant is a shader entry point, the element types bound
//! to its aliases, and its pipeline constants (the op of a unary, the kind of a reduction).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lockstep_core::Result;

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
}

/// A shader with its aliases bound: one compiled module.
type ModuleKey = (&'static str, Vec<&'static str>);

#[derive(Default)]
pub struct Pipelines {
    cache: Mutex<HashMap<Variant, Arc<wgpu::ComputePipeline>>>,
    modules: Mutex<HashMap<ModuleKey, Arc<wgpu::ShaderModule>>>,
}

impl Pipelines {
    pub fn get(&self, gpu: &Gpu, variant: &Variant) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(variant) {
            return Ok(p.clone());
        }
        let module = self.module(gpu, variant)?;
        let constants: Vec<(&str, f64)> = variant.constants.iter().map(|&(n, v)| (n, f64::from_bits(v))).collect();
        let what = format!(
            "building the {}/{} pipeline for {:?} on this driver",
            variant.shader, variant.entry, variant.types
        );
        let pipeline = gpu.scoped(wgpu::ErrorFilter::Validation, &what, || {
            gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(variant.entry),
                layout: None,
                module: &module,
                entry_point: Some(variant.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    // Every shader writes what it reads of workgroup memory first.
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })?;
        let pipeline = Arc::new(pipeline);
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(variant.clone(), pipeline.clone());
        Ok(pipeline)
    }

    fn module(&self, gpu: &Gpu, variant: &Variant) -> Result<Arc<wgpu::ShaderModule>> {
        let key = (variant.shader, variant.types.clone());
        if let Some(m) = self.modules.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(m.clone());
        }
        let shader = lockstep_shaders::shader(variant.shader)
            .ok_or_else(|| gpu.error(format!("no shader named {}", variant.shader)))?;
        let source = lockstep_shaders::compose(shader, &variant.types);
        let what = format!("compiling {}.wgsl for {:?}", variant.shader, variant.types);
        let module = gpu.scoped(wgpu::ErrorFilter::Validation, &what, || {
            gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(variant.shader),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            })
        })?;
        let module = Arc::new(module);
        self.modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, module.clone());
        Ok(module)
    }
}
