//! The cooperative-matrix tier of the matrix products (matmul_coop.wgsl): tensor cores through
//! wgpu's experimental cooperative matrices, f16 operands with f32 sums.
//!
//! Which adapters get it: those listing a square f16 -> f32 shape of edge 16 or 8 and one
//! subgroup size (the shader numbers its subgroups by invocation index). wgpu does not check a
//! shader's shape against the adapter's list, and an unlisted shape can silently give zeros, so
//! the tier also has to pass a self-test when the device opens (`WgpuBackend::settle_products`):
//! one product whose every sum is exact in f32, compared bit for bit with the SIMT kernel's.
//!
//! Who translates the shader (`LOCKSTEP_WGPU_COOP_SPIRV`, read once): on Vulkan, by default, we
//! do (`cooperative_spirv`: naga's SPIR-V with its workgroup-memory accesses made non-private,
//! handed to the driver as passthrough SPIR-V); `wgpu` leaves it to wgpu, as on every other
//! backend (Metal's simdgroup matrices).
//!
//! Which products take it (`LOCKSTEP_WGPU_COOP`, read once): f16 and bf16 products by default
//! (`bf16`), `f16` only f16 ones, `off` none. Each row of lhs and column of rhs is scaled by a
//! power of two into f16's range on the way in and back on the way out (coop_scales.wgsl), so
//! bf16's range is kept: f16 holds bf16's 8 bits of mantissa, and every product is exact and
//! summed in f32, like the SIMT kernel's; a bf16 element below 2^-33 of its row's (column's)
//! largest magnitude rounds to f16's subnormal steps.

use std::sync::OnceLock;

use lockstep_core::DType;

/// A usable cooperative-matrix shape on one adapter, and how many subgroups share a workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cooperative {
    /// The matrices' edge: 16 (NVIDIA) or 8 (Apple, lavapipe).
    pub edge: u32,
    /// The adapter's one subgroup size.
    pub subgroup: u32,
    pub tile: Tile,
    pub translation: Translation,
}

/// How a workgroup shares its output block: `grid` x `grid` subgroups (`E_GRID`), each owning
/// `frags` x `frags` matrices of it (`E_FRAGS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// The shader variant's second type, which selects the composed module.
    pub name: &'static str,
    pub grid: u32,
    pub frags: u32,
}

/// The tiles the self-test tries, in order (`LOCKSTEP_WGPU_COOP_TILE` names one to try alone):
/// the first whose workgroup memory fits and that computes right is used. More fragments a
/// subgroup load fewer matrices and stage fewer elements per product.
pub const TILES: [Tile; 3] = [
    Tile {
        name: "g2f4",
        grid: 2,
        frags: 4,
    },
    Tile {
        name: "g2f2",
        grid: 2,
        frags: 2,
    },
    Tile {
        name: "g1f2",
        grid: 1,
        frags: 2,
    },
];

impl Tile {
    /// The tile a variant's second type names.
    pub fn named(name: &str) -> Option<Tile> {
        TILES.into_iter().find(|t| t.name == name)
    }

    /// The tiles to try: all of `TILES`, or the one `LOCKSTEP_WGPU_COOP_TILE` names (read once).
    pub fn candidates() -> Vec<Tile> {
        static CHOSEN: OnceLock<Option<Tile>> = OnceLock::new();
        let chosen = *CHOSEN.get_or_init(|| {
            let name = std::env::var("LOCKSTEP_WGPU_COOP_TILE").ok()?;
            let tile = Tile::named(&name);
            if tile.is_none() {
                let names: Vec<_> = TILES.iter().map(|t| t.name).collect();
                eprintln!("lockstep: LOCKSTEP_WGPU_COOP_TILE={name:?} is not one of {names:?}; ignored");
            }
            tile
        });
        chosen.map_or(TILES.to_vec(), |t| vec![t])
    }
}

/// Who turns matmul_coop.wgsl into the driver's shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Translation {
    /// wgpu, as every other shader.
    Wgpu,
    /// `cooperative_spirv`, as passthrough SPIR-V (Vulkan).
    OwnSpirv,
}

impl Translation {
    /// `OwnSpirv` on Vulkan adapters with passthrough shaders unless `LOCKSTEP_WGPU_COOP_SPIRV=wgpu`.
    fn of(adapter: &wgpu::Adapter) -> Translation {
        static WGPU_ASKED: OnceLock<bool> = OnceLock::new();
        let wgpu_asked = *WGPU_ASKED.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_COOP_SPIRV").as_deref() {
            Ok("wgpu") => true,
            Ok("own") | Err(_) => false,
            Ok(other) => {
                eprintln!("lockstep: LOCKSTEP_WGPU_COOP_SPIRV={other:?} is not own or wgpu; ignored");
                false
            }
        });
        let vulkan = adapter.get_info().backend == wgpu::Backend::Vulkan;
        if vulkan && !wgpu_asked && adapter.features().contains(wgpu::Features::PASSTHROUGH_SHADERS) {
            Translation::OwnSpirv
        } else {
            Translation::Wgpu
        }
    }

    /// The device features this translation needs.
    pub fn features(&self) -> wgpu::Features {
        match self {
            Translation::Wgpu => wgpu::Features::empty(),
            Translation::OwnSpirv => wgpu::Features::PASSTHROUGH_SHADERS,
        }
    }
}

impl Cooperative {
    /// The shape the tier would use on `adapter`, if it lists one.
    pub fn of(adapter: &wgpu::Adapter) -> Option<Cooperative> {
        if !adapter
            .features()
            .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16)
        {
            return None;
        }
        let info = adapter.get_info();
        if info.subgroup_min_size != info.subgroup_max_size || info.subgroup_min_size == 0 {
            return None;
        }
        let f16_to_f32 = |p: &wgpu::CooperativeMatrixProperties, edge: u32| {
            (p.m_size, p.n_size, p.k_size) == (edge, edge, edge)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        };
        let shapes = adapter.cooperative_matrix_properties();
        [16, 8]
            .into_iter()
            .find(|&edge| shapes.iter().any(|p| f16_to_f32(p, edge)))
            .map(|edge| Cooperative {
                edge,
                subgroup: info.subgroup_min_size,
                tile: TILES[0],
                translation: Translation::of(adapter),
            })
    }

    /// The output rows and columns of one workgroup (`BLOCK` in matmul_coop.wgsl).
    pub fn block(&self) -> usize {
        (self.tile.frags * self.tile.grid * self.edge) as usize
    }

    /// matmul_coop.wgsl composed for this shape and tile, with elements `types`.
    pub fn source(&self, types: &[&str]) -> String {
        lockstep_shaders::compose_cooperative(self.edge, self.tile.grid, self.tile.frags, types)
    }

    /// The invocations of one workgroup.
    pub fn invocations(&self) -> u32 {
        self.tile.grid * self.tile.grid * self.subgroup
    }

    /// The workgroup memory matmul_coop.wgsl declares: the staged f16 operands (`2 BLOCK DEPTH`),
    /// a fragment of f32 sums per subgroup, the rows' and columns' scales, and k.
    pub fn workgroup_bytes(&self) -> u64 {
        let (block, edge) = (self.block() as u64, u64::from(self.edge));
        let subgroups = u64::from(self.tile.grid * self.tile.grid);
        2 * block * 2 * edge * 2 + subgroups * edge * edge * 4 + 2 * block * 8 + 4
    }

    /// `16x16x16 f16->f32, 2x2 subgroups of 32 with 4x4 matrices each, our SPIR-V`.
    pub fn describe(&self) -> String {
        let (e, g, f) = (self.edge, self.tile.grid, self.tile.frags);
        let by = match self.translation {
            Translation::Wgpu => "wgpu's translation",
            Translation::OwnSpirv => "our SPIR-V",
        };
        format!(
            "{e}x{e}x{e} f16->f32, {g}x{g} subgroups of {} with {f}x{f} matrices each, {by}",
            self.subgroup
        )
    }
}

/// Which products the tier takes (`LOCKSTEP_WGPU_COOP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Off,
    F16,
    F16AndBf16,
}

impl Policy {
    pub fn from_env() -> Policy {
        static POLICY: OnceLock<Policy> = OnceLock::new();
        *POLICY.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_COOP").as_deref() {
            Ok("off") => Policy::Off,
            Ok("f16") => Policy::F16,
            Ok("bf16") | Err(_) => Policy::F16AndBf16,
            Ok(other) => {
                eprintln!("lockstep: LOCKSTEP_WGPU_COOP={other:?} is not off, f16 or bf16; ignored");
                Policy::F16AndBf16
            }
        })
    }

    /// Whether products of `dtype` run on the tier.
    pub fn takes(&self, dtype: DType) -> bool {
        match self {
            Policy::Off => false,
            Policy::F16 => dtype == DType::F16,
            Policy::F16AndBf16 => matches!(dtype, DType::F16 | DType::BF16),
        }
    }

    /// What `devices --details` says the tier takes.
    pub fn describe(&self) -> &'static str {
        match self {
            Policy::Off => "off (LOCKSTEP_WGPU_COOP=off)",
            Policy::F16 => "f16 products (LOCKSTEP_WGPU_COOP=f16; bf16 products stay on the SIMT kernel)",
            Policy::F16AndBf16 => "f16 and bf16 products, each row and column scaled into f16's range",
        }
    }
}

/// The self-test's product: `[batch, m, k] @ [batch, k, n]` with partial blocks on every edge
/// and two batches; where it fails, the one-matrix product tells a broken matrix operation from
/// a broken tiling in the failure's message.
pub fn self_test_shapes(edge: usize) -> [(usize, usize, usize, usize); 2] {
    [(2, 5 * edge + 3, 4 * edge + 6, 6 * edge + 5), (1, edge, edge, edge)]
}

/// Operands of `self_test_shapes`: multiples of 1/8 up to 2 in magnitude, exact in f16, whose
/// products and every partial sum over k are exact in f32, so any order of summation gives the
/// same bits.
pub fn self_test_operands((batch, m, n, k): (usize, usize, usize, usize)) -> (Vec<f32>, Vec<f32>) {
    let value = |i: usize| ((i * 7 + i / 5) % 33) as f32 / 8.0 - 2.0;
    let lhs = (0..batch * m * k).map(value).collect();
    let rhs = (0..batch * k * n).map(|i| value(i + 11)).collect();
    (lhs, rhs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_test_sums_are_exact_in_f32() {
        // Every product is a multiple of 1/64 below 4 in magnitude; a sum of k of them stays a
        // multiple of 1/64 below 2^24 / 64, so f32 holds every partial sum exactly.
        for edge in [8, 16] {
            let [full, one] = self_test_shapes(edge);
            for (batch, m, n, k) in [full, one] {
                let (lhs, rhs) = self_test_operands((batch, m, n, k));
                assert_eq!((lhs.len(), rhs.len()), (batch * m * k, batch * k * n));
                assert!(
                    lhs.iter()
                        .chain(&rhs)
                        .all(|v| (v * 8.0).fract() == 0.0 && v.abs() <= 2.0)
                );
                assert!((k as f64) * 4.0 < (1u64 << 24) as f64 / 64.0);
            }
            let (_, m, n, k) = full;
            assert!(m % edge != 0 && n % edge != 0 && k % edge != 0);
        }
    }

    #[test]
    fn the_policy_takes_bf16_only_when_asked() {
        assert!(Policy::F16.takes(DType::F16) && !Policy::F16.takes(DType::BF16));
        assert!(Policy::F16AndBf16.takes(DType::BF16) && !Policy::F16AndBf16.takes(DType::F32));
        assert!(!Policy::Off.takes(DType::F16));
    }
}
