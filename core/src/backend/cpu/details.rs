//! What the CPU device says about itself beyond its name: which kernels its numbers come from
//! (`lockstep devices --details`, `lockstep check`, benchmark records).

use super::{attention, conv, matmul, simd};
use crate::backend::Conv2dGeometry;
use crate::dtype::DType;
use crate::models::resnet::{ResNetConfig, Stem, conv_layers};

/// The CPU's model name, from `/proc/cpuinfo` where there is one, else its architecture.
pub(super) fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Which kernels this CPU's products and convolutions take: numbers differ by these. The
/// convolutions are ResNet-18's (CIFAR stem, batch 64), as `conv_plans` describes them.
pub(super) fn kernel_details() -> Vec<(String, String)> {
    let bf16 = matmul::bf16_plan::plan().describe();
    let mut details: Vec<(String, String)> = [
        ("vector code", simd::level_name()),
        ("bf16 products", bf16.as_str()),
        ("attention", attention::plan()),
    ]
    .map(|(label, value)| (label.to_string(), value.to_string()))
    .into();
    let resnet18 = ResNetConfig::named("resnet18")
        .expect("resnet18 is a known name")
        .stem(Stem::Cifar);
    let layers = conv_layers(resnet18, 64, [32, 32]);
    details.push((
        "ResNet-18 convolutions".into(),
        "CIFAR stem, batch 64: forward / input grad / weight grad".into(),
    ));
    details.extend(conv_plans(layers.iter().map(|l| (l.geometry, l.out_channels))));
    details
}

/// For each distinct convolution of `layers` (geometry, output channels), in order: its shape
/// (`3x3/2 64→128 32x32`: kernel / stride, channels in → out, input pixels) and the paths this
/// process takes for it in f32 and in bf16 (with `LOCKSTEP_CPU_CONV`'s override), as
/// `f32 FORWARD / INPUT GRAD / WEIGHT GRAD · bf16 …`.
pub fn conv_plans(layers: impl IntoIterator<Item = (Conv2dGeometry, usize)>) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let mut lines = Vec::new();
    for (g, o) in layers {
        if seen.contains(&(g, o)) {
            continue;
        }
        seen.push((g, o));
        let shape = format!("{}x{}/{} {}→{} {}x{}", g.kh, g.kw, g.stride[0], g.c, o, g.h, g.w);
        let plans: Vec<String> = [DType::F32, DType::BF16]
            .into_iter()
            .filter_map(|dtype| conv::chosen(&g, o, dtype).map(|plan| format!("{dtype} {plan}")))
            .collect();
        lines.push((shape, plans.join(" · ")));
    }
    lines
}
