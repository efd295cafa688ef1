//! What an adapter's cooperative matrices do with the few ways matmul_coop.wgsl could use them:
//! one E x E x E product (E the adapter's edge) by one subgroup, operands loaded from a storage
//! buffer or from workgroup memory, row- or column-major, the sums started from storage or from
//! workgroup memory. Each probe runs twice: translated by wgpu, and as the tier's own SPIR-V on
//! Vulkan (naga's, with its workgroup-memory accesses made non-private, which wgpu's translation
//! leaves private under the Vulkan memory model). How many outputs each got wrong is printed;
//! the test asserts the ones the tier relies on, in the translation the tier uses. On a GPU
//! where the tier's self-test fails, this says which step and which translation differ. Skips
//! (loudly) without cooperative matrices; CI runs it on Mesa 26's lavapipe.

mod support;

use lockstep_wgpu::Translation;
use wgpu::util::DeviceExt;

/// A probe: its name, the body of its entry point, and whether the tier relies on it.
struct Probe {
    name: &'static str,
    body: &'static str,
    /// Whether the body loads the lhs column-major (so it computes lhsᵀ @ rhs).
    lhs_column_major: bool,
    relied_on: bool,
}

const PROBES: [Probe; 4] = [
    Probe {
        name: "storage operands, storage sums",
        body: "var c = coopLoadT<MC>(&sums[0], E);
               let a = coopLoadT<MA>(&lhs[0], E);
               let b = coopLoadT<MB>(&rhs[0], E);
               c = coopMultiplyAdd(a, b, c);
               coopStoreT(c, &sums[0], E);",
        lhs_column_major: false,
        relied_on: false,
    },
    Probe {
        name: "workgroup operands, storage sums",
        body: "for (var i = lid; i < E * E; i += SG) { lhs_w[i] = lhs[i]; rhs_w[i] = rhs[i]; }
               workgroupBarrier();
               var c = coopLoadT<MC>(&sums[0], E);
               let a = coopLoadT<MA>(&lhs_w[0], E);
               let b = coopLoadT<MB>(&rhs_w[0], E);
               c = coopMultiplyAdd(a, b, c);
               coopStoreT(c, &sums[0], E);",
        lhs_column_major: false,
        relied_on: true,
    },
    Probe {
        name: "storage operands, workgroup sums",
        body: "for (var i = lid; i < E * E; i += SG) { sums_w[i] = sums[i]; }
               workgroupBarrier();
               var c = coopLoadT<MC>(&sums_w[0], E);
               let a = coopLoadT<MA>(&lhs[0], E);
               let b = coopLoadT<MB>(&rhs[0], E);
               c = coopMultiplyAdd(a, b, c);
               coopStoreT(c, &sums_w[0], E);
               workgroupBarrier();
               for (var i = lid; i < E * E; i += SG) { sums[i] = sums_w[i]; }",
        lhs_column_major: false,
        relied_on: false,
    },
    Probe {
        name: "column-major lhs from storage",
        body: "var c = coopLoadT<MC>(&sums[0], E);
               let a = coopLoad<MA>(&lhs[0], E);
               let b = coopLoadT<MB>(&rhs[0], E);
               c = coopMultiplyAdd(a, b, c);
               coopStoreT(c, &sums[0], E);",
        lhs_column_major: true,
        relied_on: false,
    },
];

fn shader(edge: u32, subgroup: u32, body: &str) -> String {
    format!(
        "enable f16;
enable wgpu_cooperative_matrix;
const E: u32 = {edge}u;
const SG: u32 = {subgroup}u;
alias MA = coop_mat{edge}x{edge}<f16, A>;
alias MB = coop_mat{edge}x{edge}<f16, B>;
alias MC = coop_mat{edge}x{edge}<f32, C>;
@group(0) @binding(0) var<storage, read> lhs: array<f16>;
@group(0) @binding(1) var<storage, read> rhs: array<f16>;
@group(0) @binding(2) var<storage, read_write> sums: array<f32>;
var<workgroup> lhs_w: array<f16, {square}>;
var<workgroup> rhs_w: array<f16, {square}>;
var<workgroup> sums_w: array<f32, {square}>;
@compute @workgroup_size({subgroup})
fn probe(@builtin(local_invocation_index) lid: u32) {{
    {body}
}}
",
        square = edge * edge
    )
}

/// The probe as the device's shader: wgpu's translation, or our SPIR-V (passthrough).
fn module(device: &wgpu::Device, source: &str, own_spirv: bool, subgroup: u32) -> wgpu::ShaderModule {
    if !own_spirv {
        return device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("cooperative probe"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
    }
    let words = lockstep_wgpu::translate_to_vulkan_spirv(source, "probe", &[]).expect("the probe translates");
    // SAFETY: naga's translation of the probe, validated, its bindings those of `layout`; the
    // probe reads and writes only inside its E x E arrays.
    unsafe {
        device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
            label: Some("cooperative probe, our SPIR-V"),
            entry_points: vec![wgpu::PassthroughShaderEntryPoint {
                name: "probe".into(),
                workgroup_size: (subgroup, 1, 1),
            }]
            .into(),
            spirv: Some(words.into()),
            ..Default::default()
        })
    }
}

/// The probe's bindings: two operands read, the sums read and written.
fn layout(device: &wgpu::Device) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let entry = |binding, read_only| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let group = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[entry(0, true), entry(1, true), entry(2, false)],
    });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&group)],
        immediate_size: 0,
    });
    (group, pipeline)
}

/// The probe's `E x E` sums (started from `start`) on the device.
fn run(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    module: &wgpu::ShaderModule,
    operands: [&[half::f16]; 2],
    start: &[f32],
) -> Vec<f32> {
    let (group_layout, pipeline_layout) = layout(device);
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: Some(&pipeline_layout),
        module,
        entry_point: Some("probe"),
        compilation_options: Default::default(),
        cache: None,
    });
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let buffer = |bytes: &[u8]| {
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytes,
            usage,
        })
    };
    let (lhs, rhs, sums) = (
        buffer(bytemuck::cast_slice(operands[0])),
        buffer(bytemuck::cast_slice(operands[1])),
        buffer(bytemuck::cast_slice(start)),
    );
    let bytes = std::mem::size_of_val(start) as u64;
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &group_layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: lhs.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: rhs.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: sums.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    encoder.copy_buffer_to_buffer(&sums, 0, &readback, 0, bytes);
    queue.submit([encoder.finish()]);
    readback
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.expect("the probe's sums map"));
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("the probe finishes");
    let view = readback
        .slice(..)
        .get_mapped_range()
        .expect("the probe's sums are mapped");
    bytemuck::cast_slice(&view).to_vec()
}

#[test]
fn each_way_of_using_the_cooperative_matrices_matches_the_cpu() {
    let Some(device) = support::wgpu_device() else { return };
    let backend = lockstep_wgpu::backend_of(&device).expect("wgpu:0 is a wgpu backend");
    let gpu = backend.gpu();
    let Some(shape) = gpu.cooperative else {
        assert!(
            std::env::var("LOCKSTEP_EXPECT_COOP").as_deref() != Ok("1"),
            "LOCKSTEP_EXPECT_COOP=1 but wgpu:0 was opened without cooperative matrices"
        );
        eprintln!("\n*** SKIPPED: wgpu:0 has no usable cooperative matrices ***\n");
        return;
    };
    let e = shape.edge as usize;
    // Small integers: every product and sum is exact, so any correct order gives the same bits;
    // lhs is far from symmetric, so a transposed load shows (lhsᵀ @ rhs differs in most places).
    let lhs: Vec<f32> = (0..e * e).map(|i| ((i * 5 + 3 * (i / e)) % 7) as f32 - 3.0).collect();
    let rhs: Vec<f32> = (0..e * e).map(|i| ((i * 3 + i / e) % 5) as f32 - 2.0).collect();
    let start: Vec<f32> = (0..e * e).map(|i| (i % 3) as f32).collect();
    let halves = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>();
    let (lhs16, rhs16) = (halves(&lhs), halves(&rhs));
    let mut relied_on_failed = Vec::new();
    // Our SPIR-V where the device could take it (the tier's default on Vulkan).
    let translations: &[Translation] = match gpu.features.contains(wgpu::Features::PASSTHROUGH_SHADERS) {
        true => &[Translation::Wgpu, Translation::OwnSpirv],
        false => &[Translation::Wgpu],
    };
    for probe in PROBES {
        let want: Vec<f32> = (0..e * e)
            .map(|ij| {
                let (i, j) = (ij / e, ij % e);
                let a = |p: usize| {
                    if probe.lhs_column_major {
                        lhs[p * e + i]
                    } else {
                        lhs[i * e + p]
                    }
                };
                start[ij] + (0..e).map(|p| a(p) * rhs[p * e + j]).sum::<f32>()
            })
            .collect();
        let source = shader(shape.edge, shape.subgroup, probe.body);
        for &translation in translations {
            let own_spirv = translation == Translation::OwnSpirv;
            let module = module(&gpu.device, &source, own_spirv, shape.subgroup);
            let got = run(&gpu.device, &gpu.queue, &module, [&lhs16, &rhs16], &start);
            let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
            eprintln!(
                "probe {} ({translation:?}): {wrong} of {} wrong; first outputs {:?}, expected {:?}",
                probe.name,
                want.len(),
                &got[..4.min(got.len())],
                &want[..4]
            );
            if wrong > 0 && probe.relied_on && translation == shape.translation {
                relied_on_failed.push(probe.name);
            }
        }
    }
    assert!(relied_on_failed.is_empty(), "the tier relies on: {relied_on_failed:?}");
}
