//! The CPU backend's convolutions, and the one place that decides which way each is computed.
//!
//! [`plan`] takes a convolution's geometry, its output channels, the element type, the CPU's
//! features and an [`Override`], and returns a [`Plan`]: the path of the forward product, of the
//! input gradient and of the weight gradient. The paths (one file or folder each) compute and
//! decide nothing; `fused` (f32, f64 and 16-bit floats widened to f32, on `gemm`) and
//! `fused_bf16` (the AVX512-BF16 kernel, or AMX tiles) run a plan's paths over the batch's runs
//! of images.
//!
//! | path | pass | runs where | measured against the next best (ResNet-18, batch 64, 2 threads) |
//! | --- | --- | --- | --- |
//! | `unfold` (`unfold.rs`, `fused.rs`) | forward, weight grad | f32 and f64 wherever nothing below runs (bf16 on its kernel unfolds into `panels`; its weight gradient is the kernel's `unfold`) | runs of images unfolded in cache against the whole batch's columns and one GEMM (2026-11-26, Zen 5): f32 step 1925 → 1425 ms |
//! | `fold` (`fused.rs`, `fused_bf16.rs`) | input grad | where `transposed` does not run: strided, padded past `dilation·(k-1)`, or fewer than 8 input channels | `weightᵀ @ grad` into columns, folded back by col2im: the baseline |
//! | `transposed` (`transposed.rs`) | input grad | stride 1, padding at most `dilation·(k-1)`, 8 input channels or more | against `fold` (session 43, Zen 5): f32 step 962 → 915 ms; a 3-channel stem's backward took 2.9x as long, hence the 8 |
//! | `shifted` (`shifted/`) | all three (the input gradient's transposed convolution) | f32 on AVX2 + FMA without AVX-512, stride 1, output the size of the input; weight grad on planes of 64 pixels or more | against `unfold` (session 48, Zen 3): 64→64 3x3 at 32x32 forward / backward 57 / 119 → 39–46 / 85–90 ms; a 512-channel 4x4 backward 107 ms against 97 unfolded, hence the 64 pixels. Re-measured in one binary (session 49): even forward, backward 352 against 372 ms (medians), and it holds less (copies 3x the images where unfolding writes 9x) |
//! | `positions` (`positions.rs`) | all three | f32 on AVX-512F, bf16 on AVX512-BF16, where the taps left out save a tenth of the work and a tile's sum is long enough | against the paths above (sessions 55–56, Zen 4): f32 forward 256 ch 8x8 24.0 → 20.7 ms, 512 ch 4x4 23.8 → 18.5; bf16 backward 512 ch 4x4 30.1 → 20.2; f32 backward 3x3 stride 2 128 ch 16x16 29.2 → 31.0 (left out: its sums are too short) |
//! | `panels` (`panels.rs`) | forward, input grad (`transposed`) | bf16 on AVX512-BF16 where `direct` does not apply, on AMX tiles where `grid` does not (its sums padded to whole tile loads) | columns unfolded straight into the kernel's panels, against plain columns packed (session 43, Zen 5): bf16 step 604 → 586 ms |
//! | `grid` (`grid.rs`) | all three (the input gradient `transposed-grid`) | bf16 on AMX tiles, stride 1, channels in multiples of 32 (of the input, and for the input gradient of the output), output pixels at least 75% of the zero-padded images (32x32 and 16x16 with padding 1; at 8x8, 64%, it was slower than `panels`: forward 14.3-16.1 against 12.9 ms, 256 channels; at 4x4 twice as slow) | against `panels` / `transposed` / `unfold` on tiles (session 68, Emerald Rapids, 64 channels 32x32): forward 24.0 → 12.6 ms, backward 44.4 → 25.3 ms; the tiles' products read the padded copy in place, nothing unfolded |
//! | `direct` (`direct.rs`) | forward, input grad (`transposed-direct`) | bf16 on AVX512-BF16 where every panel of 32 output pixels lies in one image from column 0 and every tap's pixel in its phase plane (CIFAR's 3x3 and 1x1 at 32, 16 and 8 pixels out, stride 1 or 2) | against `panels` (sessions 45 and 58): bf16 step 575 / 592 → 475 / 475 ms (Zen 5); with the channel-paired copy, 3x3 64 ch 32x32 forward 16.1 → 13.1 ms and stride 2 from 32x32 12.5 → 8.2 ms (Zen 4) |
//!
//! Automatically, pass by pass: f32 (and f16 and bf16 without the bf16 kernels, widened to f32)
//! takes `shifted` where it runs on CPUs whose widest vectors are AVX2 (it was measured only
//! beside `gemm`'s AVX2 kernels), elsewhere `positions` where it pays; bf16 with the dot-product
//! kernel takes `positions` where it pays, else `direct` where it applies, else `panels`; bf16
//! on AMX tiles (where the process's bf16 products take them, `matmul::bf16_plan`) takes `grid`
//! where it applies, else `panels`, every product on tiles. What is left: the input gradient
//! `transposed` (in bf16 `transposed-direct` where `direct` applies) where it runs, else `fold`;
//! the forward product and the weight gradient `unfold`. f64 takes only the `gemm` paths.
//!
//! `LOCKSTEP_CPU_CONV` (read once, by [`Override::from_env`]) forces paths, to measure one
//! against another on any CPU: `auto` (the default), or a comma-separated list of `PATH`
//! (every pass that has a path of that name) and `PASS=PATH` (`forward`, `input` or `weight`).
//! `unfold` alone also forces the input gradient's `fold`. A forced path that cannot run there
//! (element type, CPU features, geometry) leaves that pass its automatic choice.

#[cfg(target_arch = "x86_64")]
mod direct;
mod fused;
#[cfg(target_arch = "x86_64")]
mod fused_bf16;
#[cfg(target_arch = "x86_64")]
mod grid;
#[cfg(target_arch = "x86_64")]
mod panels;
#[cfg(target_arch = "x86_64")]
mod positions;
mod ranges;
#[cfg(test)]
mod reference;
mod run;
mod shifted;
#[cfg(test)]
mod tests;
mod transposed;
pub(super) mod unfold;

use std::fmt;
use std::sync::OnceLock;

pub(super) use run::{backward, forward};

use crate::backend::Conv2dGeometry;
use crate::dtype::DType;

/// How a convolution's forward product is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Forward {
    /// Runs of images unfolded (im2col) in cache, multiplied by `gemm`.
    Unfold,
    /// Summed from shifted copies of the images (f32, AVX2 + FMA).
    Shifted,
    /// Tiles of one output position in 32 images, taps in the padding left out (AVX-512).
    Positions,
    /// Unfolded straight into the bf16 kernel's panels (AVX512-BF16).
    Panels,
    /// The bf16 kernel's panels read from a channel-paired copy of the images (AVX512-BF16).
    Direct,
    /// AMX tiles read from a channel-paired, zero-padded copy of the images, nothing unfolded
    /// (stride 1).
    Grid,
}

/// How a convolution's input gradient is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputGrad {
    /// `weightᵀ @ grad` into columns, folded back (col2im).
    Fold,
    /// A transposed convolution of the output gradient (stride 1): unfolded (in bf16, into
    /// panels) and multiplied by the turned weight.
    Transposed,
    /// The transposed convolution with the bf16 kernel's panels read from a copy of the
    /// gradient (`direct`).
    TransposedDirect,
    /// The transposed convolution summed from shifted copies of the gradient (f32, AVX2 + FMA).
    Shifted,
    /// By input position, the output gradient's pixels whose taps read it (AVX-512).
    Positions,
    /// The transposed convolution on AMX tiles from a padded copy of the gradient (`grid`).
    TransposedGrid,
}

/// How a convolution's weight gradient is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightGrad {
    /// Runs of images unfolded, each thread's partial sum added in order.
    Unfold,
    /// Summed from shifted copies of the images (f32, AVX2 + FMA).
    Shifted,
    /// Tap by tap over the whole batch, taps in the padding left out (AVX-512).
    Positions,
    /// Tap by tap on AMX tiles, the output gradient and the images laid on a padded grid
    /// (`grid`, stride 1).
    Grid,
}

/// The paths one convolution takes: what `CpuBackend::conv_plan` (and `conv_plans`) report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// Whether the inputs are widened to f32 and the results rounded back once (f16, and bf16
    /// without the bf16 kernel): the paths are f32's.
    pub widened: bool,
    /// Whether bf16 products run on AMX tiles (the paths' products; else the dot-product
    /// kernel, or f32's where widened).
    pub tiles: bool,
    /// The forward product's path.
    pub forward: Forward,
    /// The input gradient's path.
    pub input: InputGrad,
    /// The weight gradient's path.
    pub weight: WeightGrad,
}

impl Forward {
    const ALL: [Forward; 6] = [
        Forward::Unfold,
        Forward::Shifted,
        Forward::Positions,
        Forward::Panels,
        Forward::Direct,
        Forward::Grid,
    ];

    /// The path's name, as `LOCKSTEP_CPU_CONV` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Forward::Unfold => "unfold",
            Forward::Shifted => "shifted",
            Forward::Positions => "positions",
            Forward::Panels => "panels",
            Forward::Direct => "direct",
            Forward::Grid => "grid",
        }
    }
}

impl InputGrad {
    const ALL: [InputGrad; 6] = [
        InputGrad::Fold,
        InputGrad::Transposed,
        InputGrad::TransposedDirect,
        InputGrad::Shifted,
        InputGrad::Positions,
        InputGrad::TransposedGrid,
    ];

    /// The path's name, as `LOCKSTEP_CPU_CONV` takes it.
    pub fn name(self) -> &'static str {
        match self {
            InputGrad::Fold => "fold",
            InputGrad::Transposed => "transposed",
            InputGrad::TransposedDirect => "transposed-direct",
            InputGrad::Shifted => "shifted",
            InputGrad::Positions => "positions",
            InputGrad::TransposedGrid => "transposed-grid",
        }
    }
}

impl WeightGrad {
    const ALL: [WeightGrad; 4] = [
        WeightGrad::Unfold,
        WeightGrad::Shifted,
        WeightGrad::Positions,
        WeightGrad::Grid,
    ];

    /// The path's name, as `LOCKSTEP_CPU_CONV` takes it.
    pub fn name(self) -> &'static str {
        match self {
            WeightGrad::Unfold => "unfold",
            WeightGrad::Shifted => "shifted",
            WeightGrad::Positions => "positions",
            WeightGrad::Grid => "grid",
        }
    }
}

impl fmt::Display for Forward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for InputGrad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for WeightGrad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `forward / input grad / weight grad`, and `(widened to f32)` where it is.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} / {} / {}", self.forward, self.input, self.weight)?;
        if self.widened {
            f.write_str(" (widened to f32)")?;
        }
        if self.tiles {
            f.write_str(" (on AMX tiles)")?;
        }
        Ok(())
    }
}

/// The CPU features the paths need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    /// AVX2 and FMA (`shifted`).
    pub avx2_fma: bool,
    /// AVX-512 (F, BW, VL, DQ), the vector code's widest: `gemm`'s 16-lane kernels.
    pub avx512: bool,
    /// AVX512F: `positions` in f32.
    pub avx512f: bool,
    /// AVX512-BF16: the bf16 kernel (`panels`, `direct`, `positions` in bf16).
    pub bf16: bool,
    /// AMX tiles with bf16 (`panels`, `transposed`, `fold` and `unfold` on tiles).
    pub tiles: bool,
}

impl Cpu {
    /// This machine's.
    pub fn this() -> Cpu {
        #[cfg(target_arch = "x86_64")]
        let (avx512f, bf16) = (
            crate::backend::cpu::matmul::f32_kernel::available(),
            crate::backend::cpu::matmul::bf16_kernel::available(),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx512f, bf16) = (false, false);
        let avx2_fma = super::simd::has_avx2_fma();
        Cpu {
            avx2_fma,
            avx512: avx2_fma && !super::simd::widest_is_avx2(),
            avx512f,
            bf16,
            tiles: super::matmul::bf16_tiles_available(),
        }
    }
}

/// Paths forced for each pass (`None`: the automatic choice); see the module's documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Override {
    /// The forward product's path.
    pub forward: Option<Forward>,
    /// The input gradient's path.
    pub input: Option<InputGrad>,
    /// The weight gradient's path.
    pub weight: Option<WeightGrad>,
}

impl Override {
    /// `LOCKSTEP_CPU_CONV`'s value read once; a value it cannot read is said so on stderr
    /// (once) and ignored.
    pub fn from_env() -> Override {
        static FROM_ENV: OnceLock<Override> = OnceLock::new();
        *FROM_ENV.get_or_init(|| match std::env::var("LOCKSTEP_CPU_CONV") {
            Err(_) => Override::default(),
            Ok(value) => Override::parse(&value).unwrap_or_else(|e| {
                eprintln!("lockstep: LOCKSTEP_CPU_CONV={value:?} {e}; ignored");
                Override::default()
            }),
        })
    }

    /// `auto`, or comma-separated `PATH` and `PASS=PATH` items.
    pub fn parse(value: &str) -> Result<Override, String> {
        let mut forced = Override::default();
        for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (pass, path) = match item.split_once('=') {
                Some((pass, path)) => (Some(pass.trim()), path.trim()),
                None => (None, item),
            };
            let forward = Forward::ALL.into_iter().find(|p| p.name() == path);
            let input = InputGrad::ALL.into_iter().find(|p| p.name() == path);
            let weight = WeightGrad::ALL.into_iter().find(|p| p.name() == path);
            let known = match pass {
                None if path == "auto" => true,
                None if path == "unfold" => {
                    (forced.forward, forced.input, forced.weight) =
                        (Some(Forward::Unfold), Some(InputGrad::Fold), Some(WeightGrad::Unfold));
                    true
                }
                None => {
                    forced.forward = forward.or(forced.forward);
                    forced.input = input.or(forced.input);
                    forced.weight = weight.or(forced.weight);
                    forward.is_some() || input.is_some() || weight.is_some()
                }
                Some("forward") => forward.map(|p| forced.forward = Some(p)).is_some(),
                Some("input") => input.map(|p| forced.input = Some(p)).is_some(),
                Some("weight") => weight.map(|p| forced.weight = Some(p)).is_some(),
                Some(_) => false,
            };
            if !known {
                return Err(format!(
                    "names no path (`auto`, or PATH or PASS=PATH items: passes forward, input, weight; \
                     paths {})",
                    path_names().join(", ")
                ));
            }
        }
        Ok(forced)
    }
}

/// Every path's name, once.
fn path_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = Forward::ALL.iter().map(|p| p.name()).collect();
    names.extend(InputGrad::ALL.iter().map(|p| p.name()));
    names.extend(WeightGrad::ALL.iter().map(|p| p.name()));
    let mut unique = Vec::new();
    for name in names {
        if !unique.contains(&name) {
            unique.push(name);
        }
    }
    unique
}

/// Input channels below which the transposed input gradient is not taken automatically: the
/// product's rows are the input channels (a 3-channel stem's backward pass took 2.9x as long).
const TRANSPOSED_MIN_CHANNELS: usize = 8;

/// Planes below this many pixels keep the unfolded weight gradient where `shifted` runs the
/// rest: a 4x4 layer's tiles sum 16 pixels an image between jumps (512 channels at batch 64:
/// backward pass 107 ms, 97 unfolded).
const SHIFTED_WEIGHT_MIN_PIXELS: usize = 64;

/// Which kernels the element type computes with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernels {
    /// `gemm` in f64.
    F64,
    /// `gemm` and the f32 paths (f32, and 16-bit floats widened to f32).
    F32,
    /// The AVX512-BF16 kernel.
    Bf16,
    /// AMX tiles.
    Tiles,
}

/// The plan for a convolution of geometry `g` into `out_channels` channels in `dtype` on a CPU
/// with `cpu`'s features, with the passes `force` names forced where they can run; `None` for a
/// dtype that is not convolved (integers).
pub fn plan(g: &Conv2dGeometry, out_channels: usize, dtype: DType, cpu: &Cpu, force: Override) -> Option<Plan> {
    let kernels = match dtype {
        DType::F64 => Kernels::F64,
        DType::BF16 if cpu.tiles => Kernels::Tiles,
        DType::BF16 if cpu.bf16 => Kernels::Bf16,
        DType::F32 | DType::F16 | DType::BF16 => Kernels::F32,
        DType::I64 | DType::U32 => return None,
    };
    let can = Can {
        g,
        o: out_channels,
        kernels,
        cpu,
    };
    // `shifted` was measured only beside `gemm`'s AVX2 kernels (Zen 3); with AVX-512, `gemm`'s
    // 16-lane kernels and `positions` stay.
    let shifted_first = kernels == Kernels::F32 && cpu.avx2_fma && !cpu.avx512;
    let forward = force.forward.filter(|&p| can.forward(p)).unwrap_or_else(|| {
        let preferred: &[Forward] = match kernels {
            Kernels::F64 => &[],
            Kernels::F32 if shifted_first => &[Forward::Shifted],
            Kernels::F32 => &[Forward::Positions],
            Kernels::Bf16 => &[Forward::Positions, Forward::Direct, Forward::Panels],
            Kernels::Tiles => &[Forward::Grid, Forward::Panels],
        };
        first(preferred, |&p| can.forward(p)).unwrap_or(Forward::Unfold)
    });
    let input = force.input.filter(|&p| can.input(p)).unwrap_or_else(|| {
        let preferred: &[InputGrad] = match kernels {
            Kernels::F64 => &[InputGrad::Transposed],
            Kernels::F32 if shifted_first => &[InputGrad::Shifted, InputGrad::Transposed],
            Kernels::F32 => &[InputGrad::Positions, InputGrad::Transposed],
            Kernels::Bf16 => &[InputGrad::Positions, InputGrad::TransposedDirect, InputGrad::Transposed],
            Kernels::Tiles => &[InputGrad::TransposedGrid, InputGrad::Transposed],
        };
        let pays = |&p: &InputGrad| can.input(p) && (p == InputGrad::Positions || g.c >= TRANSPOSED_MIN_CHANNELS);
        first(preferred, pays).unwrap_or(InputGrad::Fold)
    });
    let weight = force.weight.filter(|&p| can.weight(p)).unwrap_or_else(|| {
        let preferred: &[WeightGrad] = match kernels {
            Kernels::F64 => &[],
            Kernels::Tiles => &[WeightGrad::Grid],
            Kernels::F32 if shifted_first => &[WeightGrad::Shifted],
            Kernels::F32 | Kernels::Bf16 => &[WeightGrad::Positions],
        };
        let pays =
            |&p: &WeightGrad| can.weight(p) && (p != WeightGrad::Shifted || g.h * g.w >= SHIFTED_WEIGHT_MIN_PIXELS);
        first(preferred, pays).unwrap_or(WeightGrad::Unfold)
    });
    Some(Plan {
        widened: matches!(dtype, DType::F16 | DType::BF16) && kernels == Kernels::F32,
        tiles: kernels == Kernels::Tiles,
        forward,
        input,
        weight,
    })
}

/// The first of `paths` that `ok` takes.
fn first<P: Copy>(paths: &[P], ok: impl Fn(&P) -> bool) -> Option<P> {
    paths.iter().copied().find(ok)
}

/// The plan this process takes for a convolution: [`plan`] on this CPU with
/// `LOCKSTEP_CPU_CONV`'s override, bf16 on the kernel the process's products take
/// (`bf16_plan`): AMX tiles, the dot-product kernel, or widened (on an Intel CPU without tiles
/// widened, ResNet-18's bf16-mixed step ran about 10% faster on a Sapphire Rapids than on the
/// dot-product kernel, its peak memory 24% higher).
pub fn chosen(g: &Conv2dGeometry, out_channels: usize, dtype: DType) -> Option<Plan> {
    use crate::backend::cpu::matmul::bf16_plan::{Bf16Products, plan as bf16_plan};
    let (this, products) = (Cpu::this(), bf16_plan().products);
    let cpu = Cpu {
        bf16: this.bf16 && products == Bf16Products::DotProducts,
        tiles: this.tiles && products == Bf16Products::Tiles,
        ..this
    };
    plan(g, out_channels, dtype, &cpu, Override::from_env())
}

/// Which paths can run a convolution: the kernels exist for its element type on this CPU, the
/// path handles its geometry and, for `positions`, the work it saves pays for its layout.
struct Can<'a> {
    g: &'a Conv2dGeometry,
    o: usize,
    kernels: Kernels,
    cpu: &'a Cpu,
}

impl Can<'_> {
    fn shifted(&self) -> bool {
        self.kernels == Kernels::F32 && self.cpu.avx2_fma
    }

    /// Where `positions` has its kernel for these kernels.
    fn positions(&self) -> Option<positions_pays::Lanes> {
        match self.kernels {
            Kernels::F32 if self.cpu.avx512f => Some(positions_pays::Lanes::F32),
            Kernels::Bf16 => Some(positions_pays::Lanes::Bf16),
            _ => None,
        }
    }

    fn forward(&self, path: Forward) -> bool {
        let g = self.g;
        match path {
            Forward::Unfold => self.kernels != Kernels::Bf16,
            Forward::Shifted => self.shifted() && shifted::applies(g),
            Forward::Positions => self.positions().is_some_and(|l| positions_pays::forward(l, g)),
            Forward::Panels => matches!(self.kernels, Kernels::Bf16 | Kernels::Tiles),
            Forward::Direct => self.kernels == Kernels::Bf16 && direct_applies(g),
            Forward::Grid => self.kernels == Kernels::Tiles && grid_applies::forward(g),
        }
    }

    fn input(&self, path: InputGrad) -> bool {
        let (g, o) = (self.g, self.o);
        let turned = transposed::geometry(g, o);
        match path {
            InputGrad::Fold => true,
            InputGrad::Transposed => turned.is_some(),
            InputGrad::TransposedDirect => self.kernels == Kernels::Bf16 && turned.is_some_and(|t| direct_applies(&t)),
            InputGrad::Shifted => self.shifted() && turned.is_some_and(|t| shifted::applies(&t)),
            InputGrad::Positions => self
                .positions()
                .is_some_and(|l| positions_pays::input_gradient(l, g, o)),
            InputGrad::TransposedGrid => self.kernels == Kernels::Tiles && grid_applies::input_gradient(g, o),
        }
    }

    fn weight(&self, path: WeightGrad) -> bool {
        let g = self.g;
        match path {
            WeightGrad::Unfold => true,
            WeightGrad::Shifted => self.shifted() && shifted::applies(g),
            WeightGrad::Positions => self.positions().is_some_and(|l| positions_pays::weight_gradient(l, g)),
            WeightGrad::Grid => self.kernels == Kernels::Tiles && grid_applies::forward(g),
        }
    }
}

/// Whether `direct` reads this geometry's panels from its images (x86-64 only).
fn direct_applies(g: &Conv2dGeometry) -> bool {
    #[cfg(target_arch = "x86_64")]
    return direct::applies(g);
    #[cfg(not(target_arch = "x86_64"))]
    return {
        let _ = g;
        false
    };
}

/// Whether `grid` runs a convolution's passes (x86-64 only).
mod grid_applies {
    use crate::backend::Conv2dGeometry;

    /// The forward product's and the weight gradient's.
    #[cfg(target_arch = "x86_64")]
    pub fn forward(g: &Conv2dGeometry) -> bool {
        super::grid::applies(g)
    }

    #[cfg(target_arch = "x86_64")]
    pub fn input_gradient(g: &Conv2dGeometry, o: usize) -> bool {
        super::grid::applies_to_input_gradient(g, o)
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn forward(_: &Conv2dGeometry) -> bool {
        false
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn input_gradient(_: &Conv2dGeometry, _: usize) -> bool {
        false
    }
}

/// Whether `positions` pays, per element type (x86-64 only).
mod positions_pays {
    use crate::backend::Conv2dGeometry;

    /// The element type of `positions`' tiles.
    #[derive(Clone, Copy)]
    pub enum Lanes {
        F32,
        Bf16,
    }

    #[cfg(target_arch = "x86_64")]
    fn pays(lanes: Lanes, plan: super::positions::Plan) -> bool {
        match lanes {
            Lanes::F32 => plan.pays::<f32>(),
            Lanes::Bf16 => plan.pays::<half::bf16>(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn forward(lanes: Lanes, g: &Conv2dGeometry) -> bool {
        pays(lanes, super::positions::Plan::forward(g))
    }

    #[cfg(target_arch = "x86_64")]
    pub fn input_gradient(lanes: Lanes, g: &Conv2dGeometry, o: usize) -> bool {
        pays(lanes, super::positions::Plan::input_gradient(g, o))
    }

    #[cfg(target_arch = "x86_64")]
    pub fn weight_gradient(lanes: Lanes, g: &Conv2dGeometry) -> bool {
        pays(lanes, super::positions::Plan::weight_gradient(g))
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn forward(_: Lanes, _: &Conv2dGeometry) -> bool {
        false
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn input_gradient(_: Lanes, _: &Conv2dGeometry, _: usize) -> bool {
        false
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn weight_gradient(_: Lanes, _: &Conv2dGeometry) -> bool {
        false
    }
}
