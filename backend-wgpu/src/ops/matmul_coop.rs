//! Matrix products on the cooperative-matrix tier (matmul_coop.wgsl; see `cooperative` for which
//! adapters and products), and the self-test that lets the tier on when the device opens.

use lockstep_core::backend::{BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, HostVec, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::cooperative::{Cooperative, Policy, self_test_operands};
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
        let MatmulDims { batch, m, n, k } = dims;
        let a = self.operand(OP, lhs, Some(ll))?;
        let b = self.operand(OP, rhs, Some(rl))?;
        let t = self.element_type(OP, a.dtype())?;
        let out = self.alloc(a.dtype(), batch * m * n)?;
        if batch * m * n == 0 {
            return Ok(out);
        }
        let mut params = vec![to_u32(OP, m)?, to_u32(OP, n)?, to_u32(OP, k)?];
        for layout in [ll, rl] {
            params.push(to_u32(OP, layout.offset)?);
            for &s in &layout.strides {
                params.push(to_u32(OP, s)?);
            }
        }
        params.push(to_u32(OP, batch)?);
        let block = tier.block();
        let blocks = batch * m.div_ceil(block) * n.div_ceil(block);
        let variant = Variant::new("matmul_coop", "matmul_coop", &[t]).constant("SUBGROUP", tier.subgroup as f64);
        self.launch(
            &variant,
            &params,
            &[(1, a), (2, b), (3, &out)],
            self.groups(OP, blocks)?,
        )?;
        Ok(out)
    }

    /// Decides once, when the device opens, whether products may use the cooperative tier: where
    /// the adapter offers it and the policy is not off, one product on the tier must equal the
    /// SIMT kernel's bit for bit, else the tier steps aside with one line on stderr.
    pub(crate) fn settle_products(&self) {
        let tier = self.gpu.cooperative.filter(|_| Policy::from_env() != Policy::Off);
        let passed = tier.filter(|&tier| match self.cooperative_self_test(tier) {
            Ok(true) => true,
            Ok(false) => {
                eprintln!(
                    "lockstep: {}: cooperative-matrix products ({}) disagree with the SIMT kernel on the \
                     self-test; products stay on the SIMT kernel",
                    self.gpu.location,
                    tier.describe()
                );
                false
            }
            Err(e) => {
                eprintln!(
                    "lockstep: {}: cooperative-matrix products ({}) failed to run ({e}); products stay \
                     on the SIMT kernel",
                    self.gpu.location,
                    tier.describe()
                );
                false
            }
        });
        self.set_cooperative_tier(passed);
    }

    fn cooperative_self_test(&self, tier: Cooperative) -> Result<bool> {
        let (m, n, k, lhs, rhs) = self_test_operands(tier.edge as usize);
        let half = |v: Vec<f32>| HostVec::F16(v.into_iter().map(half::f16::from_f32).collect());
        let (lhs, rhs) = (self.upload(&half(lhs))?, self.upload(&half(rhs))?);
        let (ll, rl) = (Layout::contiguous([2, m, k]), Layout::contiguous([2, k, n]));
        let dims = MatmulDims { batch: 2, m, n, k };
        let on_tier = self.gemm_on_tier(tier, &lhs, &ll, &rhs, &rl, dims)?;
        let simt = self.gemm(&lhs, &ll, &rhs, &rl, dims)?;
        let out = Layout::contiguous([2, m, n]);
        Ok(self.download(&on_tier, &out)? == self.download(&simt, &out)?)
    }
}
