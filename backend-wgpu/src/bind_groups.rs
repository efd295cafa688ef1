//! Bind groups kept for reuse. A training step binds the same pooled buffers to the same
//! pipelines every step, and the parameter arena sits at a dynamic offset, so after the first
//! step its dispatches find their bind groups here instead of creating new ones.
//!
//! A cached group keeps its buffers alive (the key holds them too, so a buffer's identity cannot
//! be reused while a group names it). The cache is therefore bounded, in two generations: a group
//! unused for a whole generation is dropped. And it is emptied whenever the pool gives its
//! buffers back to the driver (`clear`), so their memory is really freed.

use std::collections::HashMap;

use crate::bind_layout::PARAMS_WINDOW;
use crate::buffer::WgpuBuffer;

/// Bind groups per generation: a few steps' worth of distinct dispatches of a large model.
const GENERATION: usize = 1024;

/// A layout and the buffers at its bindings (the arena is the same for every group).
type Key = (wgpu::BindGroupLayout, Vec<(u32, wgpu::Buffer)>);

#[derive(Default)]
pub struct BindGroups {
    current: HashMap<Key, wgpu::BindGroup>,
    previous: HashMap<Key, wgpu::BindGroup>,
}

impl BindGroups {
    /// The bind group for `layout` with a `PARAMS_WINDOW` of `arena` at binding 0 (its offset is
    /// dynamic) and `buffers` bound whole; true when it had to be created.
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        layout: &wgpu::BindGroupLayout,
        arena: &wgpu::Buffer,
        buffers: &[(u32, &WgpuBuffer)],
    ) -> (wgpu::BindGroup, bool) {
        let key: Key = (
            layout.clone(),
            buffers.iter().map(|&(binding, b)| (binding, b.raw().clone())).collect(),
        );
        if let Some(group) = self.current.get(&key) {
            return (group.clone(), false);
        }
        let (group, created) = match self.previous.remove(&key) {
            Some(group) => (group, false),
            None => (create(device, &key, arena), true),
        };
        if self.current.len() >= GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, group.clone());
        (group, created)
    }

    /// Drops every cached group (and with them the last references to buffers the pool freed).
    pub fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
    }
}

fn create(device: &wgpu::Device, (layout, buffers): &Key, arena: &wgpu::Buffer) -> wgpu::BindGroup {
    let params = wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: arena,
            offset: 0,
            size: wgpu::BufferSize::new(PARAMS_WINDOW),
        }),
    };
    let entries: Vec<_> = std::iter::once(params)
        .chain(buffers.iter().map(|(binding, b)| wgpu::BindGroupEntry {
            binding: *binding,
            resource: b.as_entire_binding(),
        }))
        .collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout,
        entries: &entries,
    })
}
