//! Inner loops compiled for the widest vector instructions the CPU has. The crate is built for
//! baseline x86-64, whose vectors are SSE2's four floats; a kernel's loop run through [`wide`]
//! is compiled again inside a function with AVX-512 (or AVX2) enabled and picked at run time. The same IEEE operations in the same order, only more lanes at once (no
//! fused multiply-adds are formed, no sums reassociated), so every level gives the same bits.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Avx512,
    Avx2,
    Baseline,
}

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let has = |f: &str| match f {
                "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
                "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
                "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
                "avx512dq" => std::arch::is_x86_feature_detected!("avx512dq"),
                "avx2" => std::arch::is_x86_feature_detected!("avx2"),
                "fma" => std::arch::is_x86_feature_detected!("fma"),
                _ => false,
            };
            if ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"]
                .iter()
                .all(|f| has(f))
            {
                return Level::Avx512;
            }
            if has("avx2") && has("fma") {
                return Level::Avx2;
            }
        }
        Level::Baseline
    })
}

/// The vector instructions the inner loops run on, as `lockstep devices --details` says it.
pub fn level_name() -> &'static str {
    match level() {
        Level::Avx512 => "AVX-512",
        Level::Avx2 => "AVX2 + FMA",
        Level::Baseline => "SSE2 (no AVX2 found)",
    }
}

/// Whether the CPU has AVX2 and FMA (with or without AVX-512): for kernels written with their
/// intrinsics.
pub fn has_avx2_fma() -> bool {
    level() != Level::Baseline
}

/// Whether the CPU has every AVX-512 feature `wide` compiles for: for kernels written with
/// their intrinsics.
pub fn has_avx512() -> bool {
    level() == Level::Avx512
}

/// Whether AVX2 and FMA are the widest vectors the CPU has (no AVX-512).
pub fn widest_is_avx2() -> bool {
    level() == Level::Avx2
}

/// A kernel's inner loop over one chunk, its inputs held in the implementing struct. `run` must
/// be `#[inline(always)]`: it is then inlined into [`wide`]'s copies compiled with wider vector
/// features. (A closure or a function passed by value is called through a shim the compiler
/// may keep out of line, compiled for the baseline.)
pub trait Kernel {
    type Out;
    fn run(self) -> Self::Out;
}

/// Runs `kernel` compiled for the CPU's widest vectors. For the loop over one parallel task's
/// chunk, not around the parallel iterator, whose tasks run elsewhere.
#[inline(always)]
pub fn wide<K: Kernel>(kernel: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level` returned Avx512 only after the CPU reported every feature enabled there.
        Level::Avx512 => return unsafe { avx512(kernel) },
        // SAFETY: `level` returned Avx2 only after the CPU reported AVX2 and FMA.
        Level::Avx2 => return unsafe { avx2(kernel) },
        Level::Baseline => {}
    }
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn avx512<K: Kernel>(kernel: K) -> K::Out {
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<K: Kernel>(kernel: K) -> K::Out {
    kernel.run()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bits<'a>(&'a [f32]);
    impl Kernel for Bits<'_> {
        type Out = Vec<u32>;
        #[inline(always)]
        fn run(self) -> Vec<u32> {
            let f = |v: f32| crate::backend::cpu::fast_math::gelu_grad(v) * 1.5 + v / 3.0;
            self.0.iter().map(|&v| f(v).to_bits()).collect()
        }
    }

    #[test]
    fn every_level_gives_the_baseline_bits() {
        let x: Vec<f32> = (0..10_000).map(|i| (i as f32 * 0.37).sin() * 40.0 - 3.0).collect();
        let baseline = Bits(&x).run();
        let widened = wide(Bits(&x));
        assert_eq!(baseline, widened, "at level {:?}", level());
    }
}
