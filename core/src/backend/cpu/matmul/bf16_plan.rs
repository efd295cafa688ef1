//! Which way bf16 products run on this CPU: on its AVX512-BF16 dot-product instructions
//! (`bf16_kernel`), or widened to f32 for the f32 kernel. Both multiply the same bf16 values
//! exactly (a bf16 product fits f32's mantissa) and sum in f32; they differ in summation order,
//! so the choice is fixed per process (results repeat run to run) and `devices --details` names it.
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
    /// On AVX512-BF16's `vdpbf16ps`.
    DotProducts,
    /// Operands widened to f32, the f32 kernel, the result rounded once.
    Widened,
}

/// The choice for this process and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Plan {
    pub products: Bf16Products,
    pub why: &'static str,
}

impl Bf16Plan {
    /// Whether products run on the dot-product kernel.
    pub fn dot_products(&self) -> bool {
        self.products == Bf16Products::DotProducts
    }
}

/// Who made the CPU, as far as the choice cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Intel,
    Other,
}

/// The process's choice: `LOCKSTEP_CPU_BF16` (`dot` or `widen`) if set, else by `choose`.
pub fn plan() -> Bf16Plan {
    static PLAN: OnceLock<Bf16Plan> = OnceLock::new();
    *PLAN.get_or_init(|| {
        let forced = match std::env::var("LOCKSTEP_CPU_BF16").as_deref() {
            Err(_) | Ok("auto") => None,
            Ok("dot") => Some(Bf16Products::DotProducts),
            Ok("widen") => Some(Bf16Products::Widened),
            Ok(other) => {
                eprintln!("lockstep: LOCKSTEP_CPU_BF16={other:?} is none of \"auto\", \"dot\", \"widen\"; ignored");
                None
            }
        };
        choose(super::bf16_kernel_available(), vendor(), forced)
    })
}

/// The choice on a CPU that has the dot-product kernel or not, from `vendor`, unless `forced`.
pub fn choose(kernel: bool, vendor: Vendor, forced: Option<Bf16Products>) -> Bf16Plan {
    let plan = |products, why| Bf16Plan { products, why };
    match (kernel, forced, vendor) {
        (false, Some(Bf16Products::DotProducts), _) => plan(
            Bf16Products::Widened,
            "no AVX512-BF16 on this CPU (LOCKSTEP_CPU_BF16=dot cannot apply)",
        ),
        (false, _, _) => plan(Bf16Products::Widened, "no AVX512-BF16 on this CPU"),
        (true, Some(products), _) => plan(products, "as LOCKSTEP_CPU_BF16 asks"),
        (true, None, Vendor::Intel) => plan(
            Bf16Products::Widened,
            "Intel issues one vdpbf16ps a cycle beside two FMAs: f32 is faster (LOCKSTEP_CPU_BF16=dot)",
        ),
        (true, None, Vendor::Other) => plan(
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

    #[test]
    fn intel_widens_others_take_the_dot_product_and_the_variable_overrides_where_it_can() {
        use Bf16Products::*;
        let products = |kernel, vendor, forced| choose(kernel, vendor, forced).products;
        assert_eq!(products(true, Vendor::Intel, None), Widened);
        assert_eq!(products(true, Vendor::Other, None), DotProducts);
        assert_eq!(products(true, Vendor::Intel, Some(DotProducts)), DotProducts);
        assert_eq!(products(true, Vendor::Other, Some(Widened)), Widened);
        for vendor in [Vendor::Intel, Vendor::Other] {
            for forced in [None, Some(DotProducts), Some(Widened)] {
                assert_eq!(products(false, vendor, forced), Widened, "no kernel: {forced:?}");
            }
        }
        assert!(
            choose(false, Vendor::Other, Some(DotProducts))
                .why
                .contains("cannot apply")
        );
    }
}
