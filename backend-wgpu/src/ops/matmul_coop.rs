//! Matrix products on the cooperative-matrix tier (matmul_coop.wgsl; see `cooperative` for which
//! adapters and products), and the self-test that lets the tier on when the device opens.

use std::sync::Arc;

use lockstep_core::backend::{BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::WgpuBackend;
use crate::buffer::WgpuBuffer;
use crate::cooperative::{Cooperative, Policy, Tile, self_test_operands, self_test_shapes};
use crate::ops::matmul::product_params;
use crate::pipelines::Variant;

const OP: &str = "matmul";

impl WgpuBackend {
    /// The product on the cooperative tier where it is on and takes these operands (unsplit k; a
    /// bf16 output packed two to a word needs an even n); None where the other kernels run it.
    pub(crate) fn gemm_cooperative(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
        unsplit: bool,
    ) -> Result<Option<BufferRef>> {
        let Some(tier) = self.cooperative_tier() else {
            return Ok(None);
        };
        let dtype = lhs.dtype();
        let applies = unsplit
            && rhs.dtype() == dtype
            && Policy::from_env().takes(dtype)
            && (dtype != DType::BF16 || dims.n.is_multiple_of(2));
        if !applies {
            return Ok(None);
        }
        self.gemm_on_tier(tier, lhs, ll, rhs, rl, dims).map(Some)
    }

    fn gemm_on_tier(
        &self,
        tier: Cooperative,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        let MatmulDims { batch, m, n, .. } = dims;
        let a = self.operand(OP, lhs, Some(ll))?;
        let b = self.operand(OP, rhs, Some(rl))?;
        let t = self.element_type(OP, a.dtype())?;
        let out = self.alloc("matmul", a.dtype(), batch * m * n)?;
        if batch * m * n == 0 {
            return Ok(out);
        }
        let params = product_params(ll, rl, dims)?;
        let scales = self.cooperative_scales(t, &params, a, b, dims)?;
        let block = tier.block();
        let blocks = batch * m.div_ceil(block) * n.div_ceil(block);
        let variant =
            Variant::new("matmul_coop", "matmul_coop", &[t, tier.tile.name]).constant("SUBGROUP", tier.subgroup as f64);
        self.launch(
            &variant,
            &params,
            &[(1, a), (2, b), (3, &out), (4, &scales)],
            self.groups(OP, blocks)?,
        )?;
        Ok(out)
    }

    /// The power-of-two scales (and their inverses) of lhs's rows and rhs's columns that bring
    /// each into f16's range on the tier (coop_scales.wgsl): `2 (batch m + batch n)` f32s.
    fn cooperative_scales(
        &self,
        t: &'static str,
        params: &[u32],
        lhs: &WgpuBuffer,
        rhs: &WgpuBuffer,
        dims: MatmulDims,
    ) -> Result<Arc<WgpuBuffer>> {
        let MatmulDims { batch, m, n, k } = dims;
        let lines = batch * (m + n);
        let scales = self.alloc(OP, DType::F32, 2 * lines)?;
        let (group, groups) = self.row_groups(OP, lines, k)?;
        let mut params = params.to_vec();
        params.push(group);
        self.launch(
            &Variant::new("coop_scales", "coop_scales", &[t]),
            &params,
            &[(1, lhs), (2, rhs), (3, &scales)],
            groups,
        )?;
        Ok(scales)
    }

    /// Decides once, when the device opens, whether products may use the cooperative tier: where
    /// the adapter offers it and the policy is not off, the first tile that fits the device's
    /// workgroup limits and whose product on the tier equals the SIMT kernel's bit for bit; else
    /// the tier steps aside, saying on stderr how each tile went.
    pub(crate) fn settle_products(&self) {
        let Some(shape) = self.gpu.cooperative.filter(|_| Policy::from_env() != Policy::Off) else {
            return self.set_cooperative_tier(None);
        };
        let limits = &self.gpu.limits;
        let mut failures = Vec::new();
        for tile in Tile::candidates() {
            let tier = Cooperative { tile, ..shape };
            let memory = tier.workgroup_bytes();
            if memory > u64::from(limits.max_compute_workgroup_storage_size)
                || tier.invocations() > limits.max_compute_invocations_per_workgroup
            {
                failures.push(format!(
                    "{}: needs {memory} bytes of workgroup memory and {} invocations (the device allows {} and {})",
                    tier.describe(),
                    tier.invocations(),
                    limits.max_compute_workgroup_storage_size,
                    limits.max_compute_invocations_per_workgroup
                ));
                continue;
            }
            match self.cooperative_self_test(tier) {
                Ok(None) => return self.set_cooperative_tier(Some(tier)),
                Ok(Some(mismatch)) => failures.push(format!("{}: {mismatch}", tier.describe())),
                Err(e) => failures.push(format!("{}: failed to run ({e})", tier.describe())),
            }
        }
        eprintln!(
            "lockstep: {}: cooperative-matrix products disagree with the SIMT kernel on the self-test, \
             so products stay on the SIMT kernel; {}",
            self.gpu.location,
            failures.join("; ")
        );
        self.set_cooperative_tier(None);
    }

    /// None where the tier's product equals the SIMT kernel's bit for bit, else what differs (and
    /// whether a single matrix's product is right).
    fn cooperative_self_test(&self, tier: Cooperative) -> Result<Option<String>> {
        let [full, one] = self_test_shapes(tier.edge as usize);
        let Some(mismatch) = self.cooperative_product_check(tier, full)? else {
            return Ok(None);
        };
        let single = match self.cooperative_product_check(tier, one)? {
            None => "right".into(),
            Some(m) => m,
        };
        let e = tier.edge;
        Ok(Some(format!("{mismatch} (one {e}x{e}x{e} product alone: {single})")))
    }

    fn cooperative_product_check(
        &self,
        tier: Cooperative,
        shape: (usize, usize, usize, usize),
    ) -> Result<Option<String>> {
        let (batch, m, n, k) = shape;
        let (lhs, rhs) = self_test_operands(shape);
        let half = |v: Vec<f32>| HostVec::F16(v.into_iter().map(half::f16::from_f32).collect());
        let (lhs, rhs) = (self.upload(&half(lhs))?, self.upload(&half(rhs))?);
        let (ll, rl) = (Layout::contiguous([batch, m, k]), Layout::contiguous([batch, k, n]));
        let dims = MatmulDims { batch, m, n, k };
        let on_tier = self.gemm_on_tier(tier, &lhs, &ll, &rhs, &rl, dims)?;
        let simt = self.gemm(&lhs, &ll, &rhs, &rl, dims)?;
        let out = Layout::contiguous([batch, m, n]);
        let as_f32 = |v: HostVec| match v {
            HostVec::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            _ => Vec::new(),
        };
        let (got, want): (Vec<f32>, Vec<f32>) = (
            as_f32(self.download(&on_tier, &out)?),
            as_f32(self.download(&simt, &out)?),
        );
        Ok(describe_mismatch(&got, &want, m, n))
    }
}

/// What differs between the tier's product `got` and the reference `want` (`[batch, m, n]`): how
/// many elements, the first, and how many came out zero (an unsupported shape gives zeros).
fn describe_mismatch(got: &[f32], want: &[f32], m: usize, n: usize) -> Option<String> {
    let differ: Vec<usize> = (0..want.len()).filter(|&i| got.get(i) != Some(&want[i])).collect();
    let &first = differ.first()?;
    let zeros = got.iter().filter(|&&v| v == 0.0).count();
    let (b, i, j) = (first / (m * n), first / n % m, first % n);
    Some(format!(
        "{} of {} differ, the first at [{b}, {i}, {j}]: {} for {}; {zeros} zeros",
        differ.len(),
        want.len(),
        got.get(first).copied().unwrap_or(f32::NAN),
        want[first]
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_mismatch_names_its_first_element() {
        let want = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        assert_eq!(super::describe_mismatch(&want, &want, 2, 2), None);
        let mut got = want;
        got[6] = 0.0;
        assert_eq!(
            super::describe_mismatch(&got, &want, 2, 2).as_deref(),
            Some("1 of 8 differ, the first at [1, 1, 0]: 0 for 7; 1 zeros")
        );
    }
}
