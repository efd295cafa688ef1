//! Which way bf16 products run on this CPU: on AMX tiles (`amx`), on its AVX512-BF16
//! dot-product instructions (`bf16_kernel`), or widened to f32 for the f32 kernel. All multiply
//! the same bf16 values exactly (a bf16 product fits f32's mantissa) and sum in f32; they differ
//! in summation order, so the choice is fixed per process (results repeat run to run) and
//! `devices --details` names it.
//!
//! Tiles win wherever the CPU has them (Sapphire Rapids and later): `tdpbf16ps` does 8192
//! multiply-adds an instruction, about 1 TFLOP/s on one core of a Xeon VM against 130 GFLOP/s
//! of f32 FMAs.
//!
//! The dot product is not faster everywhere. AMD's Zen 4 and 5 issue `vdpbf16ps` as often as
//! an FMA, so it does twice the multiply-adds (Zen 5: bf16 products at about 2x f32). Intel's
//! cores issue it once a cycle beside two 512-bit FMAs: on a Sapphire Rapids VM the widened path
//! ran a 2048² bf16 product at 254 GFLOP/s against the dot product's 179, and gpt-char's
//! bf16-mixed step 15-20% faster. So Intel widens, others take the dot product.

use std::sync::OnceLock;

/// How a bf16 product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Products {
    /// On AMX tiles' `tdpbf16ps`.
    Tiles,
    /// On AVX512-BF16's `vdpbf16ps`.
    DotProducts,
    /// Operands widened to f32, the f32 kernel, the result rounded once.
    Widened,
}

impl Bf16Products {
    /// Every path, fastest first, in the order of their discriminants.
    pub const ALL: [Bf16Products; 3] = [Bf16Products::Tiles, Bf16Products::DotProducts, Bf16Products::Widened];
}

/// The choice for this process and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Plan {
    pub products: Bf16Products,
    pub why: &'static str,
}

impl Bf16Plan {
    /// How `devices --details` names the path.
    pub fn describe(&self) -> String {
        let path = match self.products {
            Bf16Products::Tiles => "AMX tiles",
            Bf16Products::DotProducts => "AVX512-BF16 dot products",
            Bf16Products::Widened => "widened to f32",
        };
        format!("{path}: {}", self.why)
    }
}

/// The bf16 kernels this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// AMX tiles with bf16, granted by the OS.
    pub tiles: bool,
    /// AVX512-BF16.
    pub dot_products: bool,
}

impl Kernels {
    /// This CPU's.
    pub fn of_this_cpu() -> Kernels {
        Kernels {
            tiles: super::bf16_tiles_available(),
            dot_products: super::bf16_kernel_available(),
        }
    }

    /// Whether `products` runs here (widening always does).
    pub fn run(&self, products: Bf16Products) -> bool {
        match products {
            Bf16Products::Tiles => self.tiles,
            Bf16Products::DotProducts => self.dot_products,
            Bf16Products::Widened => true,
        }
    }
}

/// One device's bf16 path: the process's plan until a test or benchmark sets another.
#[derive(Debug)]
pub struct ProductsSwitch(std::sync::atomic::AtomicU8);

impl ProductsSwitch {
    pub fn new(products: Bf16Products) -> Self {
        let switch = ProductsSwitch(Default::default());
        switch.set(products);
        switch
    }
    pub fn get(&self) -> Bf16Products {
        Bf16Products::ALL[usize::from(self.0.load(std::sync::atomic::Ordering::Relaxed))]
    }
    pub fn set(&self, products: Bf16Products) {
        self.0.store(products as u8, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Who made the CPU, as far as the choice cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Intel,
    Other,
}

/// The process's choice: `LOCKSTEP_CPU_BF16` (`tiles`, `dot` or `widen`) if set, else by
/// `choose`.
pub fn plan() -> Bf16Plan {
    static PLAN: OnceLock<Bf16Plan> = OnceLock::new();
    *PLAN.get_or_init(|| {
        let forced = match std::env::var("LOCKSTEP_CPU_BF16").as_deref() {
            Err(_) | Ok("auto") => None,
            Ok("tiles") => Some(Bf16Products::Tiles),
            Ok("dot") => Some(Bf16Products::DotProducts),
            Ok("widen") => Some(Bf16Products::Widened),
            Ok(other) => {
                eprintln!(
                    "lockstep: LOCKSTEP_CPU_BF16={other:?} is none of \"auto\", \"tiles\", \"dot\", \"widen\"; ignored"
                );
                None
            }
        };
        choose(Kernels::of_this_cpu(), vendor(), forced)
    })
}

/// The choice on a CPU with `kernels`, from `vendor`, unless `forced`.
pub fn choose(kernels: Kernels, vendor: Vendor, forced: Option<Bf16Products>) -> Bf16Plan {
    let plan = |products, why| Bf16Plan { products, why };
    match forced {
        Some(products) if kernels.run(products) => return plan(products, "as LOCKSTEP_CPU_BF16 asks"),
        Some(Bf16Products::Tiles) => {
            return plan(
                Bf16Products::Widened,
                "no AMX tiles for this process (LOCKSTEP_CPU_BF16=tiles cannot apply)",
            );
        }
        Some(_) if !kernels.dot_products => {
            return plan(
                Bf16Products::Widened,
                "no AVX512-BF16 on this CPU (LOCKSTEP_CPU_BF16=dot cannot apply)",
            );
        }
        _ => {}
    }
    match (kernels.tiles, kernels.dot_products, vendor) {
        (true, _, _) => plan(
            Bf16Products::Tiles,
            "8192 multiply-adds an instruction (LOCKSTEP_CPU_BF16=dot or widen)",
        ),
        (false, false, _) => plan(Bf16Products::Widened, "no AVX512-BF16 on this CPU"),
        (false, true, Vendor::Intel) => plan(
            Bf16Products::Widened,
            "Intel issues one vdpbf16ps a cycle beside two FMAs: f32 is faster (LOCKSTEP_CPU_BF16=dot)",
        ),
        (false, true, Vendor::Other) => plan(
            Bf16Products::DotProducts,
            "twice an FMA's multiply-adds (LOCKSTEP_CPU_BF16=widen)",
        ),
    }
}

/// This CPU's vendor, from CPUID leaf 0.
fn vendor() -> Vendor {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let name: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        if name == b"GenuineIntel" {
            return Vendor::Intel;
        }
    }
    Vendor::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOT: Kernels = Kernels {
        tiles: false,
        dot_products: true,
    };
    const BOTH: Kernels = Kernels {
        tiles: true,
        dot_products: true,
    };
    const NONE: Kernels = Kernels {
        tiles: false,
        dot_products: false,
    };

    #[test]
    fn tiles_first_then_intel_widens_others_take_the_dot_product_and_the_variable_overrides_where_it_can() {
        use Bf16Products::*;
        let products = |kernels, vendor, forced| choose(kernels, vendor, forced).products;
        assert_eq!(products(BOTH, Vendor::Intel, None), Tiles);
        assert_eq!(products(BOTH, Vendor::Intel, Some(DotProducts)), DotProducts);
        assert_eq!(products(BOTH, Vendor::Intel, Some(Widened)), Widened);
        assert_eq!(products(DOT, Vendor::Intel, None), Widened);
        assert_eq!(products(DOT, Vendor::Other, None), DotProducts);
        assert_eq!(products(DOT, Vendor::Intel, Some(DotProducts)), DotProducts);
        assert_eq!(products(DOT, Vendor::Other, Some(Widened)), Widened);
        for vendor in [Vendor::Intel, Vendor::Other] {
            assert_eq!(products(DOT, vendor, Some(Tiles)), Widened, "no tiles");
            for forced in [None, Some(Tiles), Some(DotProducts), Some(Widened)] {
                assert_eq!(products(NONE, vendor, forced), Widened, "no kernel: {forced:?}");
            }
        }
        for (kernels, forced) in [(NONE, DotProducts), (DOT, Tiles)] {
            let plan = choose(kernels, Vendor::Other, Some(forced));
            assert!(plan.why.contains("cannot apply"), "{plan:?}");
        }
    }

    #[test]
    fn a_switch_gives_back_what_was_set() {
        use Bf16Products::*;
        let switch = ProductsSwitch::new(Widened);
        for products in [Tiles, DotProducts, Widened, Tiles] {
            switch.set(products);
            assert_eq!(switch.get(), products);
        }
    }
}
