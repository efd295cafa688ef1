//! matmul (matmul.wgsl): batched, any strides, tiled through workgroup memory, on a grid of output
//! blocks that folds into y beyond 65535 workgroups; k split across workgroups where the output
//! has too few blocks to keep a GPU busy; bf16 read and written in its packed words.
//! Block products of 64x64 (`matmul`), and of 128x128 or 64x128 (`matmul_wide`, double-buffered
//! and staged along each operand's contiguous axis); `MatmulKernel` says which runs. All sum each
//! output's k in order, one fma a k, and the split depends on the shape alone, so the choice never
//! changes a result's bits.

use std::sync::OnceLock;

use lockstep_core::backend::{BufferRef, MatmulDims};
use lockstep_core::shape::Layout;
use lockstep_core::{DType, Error, Result};

use crate::backend::{WgpuBackend, to_u32};
use crate::pipelines::Variant;

/// Output rows and columns per workgroup of the tiled kernel (`TILE` in matmul.wgsl).
const TILE: usize = 64;
/// The same for the wide kernel (`WIDE`), whose blocks may also have half as many rows.
const WIDE: usize = 128;
/// Workgroup memory the wide kernel takes for a k step of `wide_k`: two buffers of two
/// `wide_k` x 128 f32 tiles, whatever its rows (16 KiB for 8, WebGPU's default limit).
fn wide_workgroup_bytes(wide_k: usize) -> usize {
    2 * 2 * wide_k * WIDE * 4
}
/// The least of workgroups for which `auto` takes the wide kernel: about one per compute unit of
/// a large GPU (an H200 has 132), below which 64x64 blocks spread wider.
const WIDE_MIN_GROUPS: usize = 128;
/// The naive kernel's workgroup edge.
const NAIVE_EDGE: usize = 16;
/// The k step of the tiled kernel (`TILE_K`): split chunks are multiples of it.
const TILE_K: usize = 16;
/// Workgroups a split product aims for: a few per compute unit of a large GPU (an H200 has 132).
const SPLIT_TARGET_WORKGROUPS: usize = 512;
/// The least of k a split sums, so its partial products cost little beside its arithmetic.
const MIN_SPLIT_K: usize = 1024;

/// The chunk of k each workgroup sums where the output has too few `TILE` blocks to fill a GPU
/// and k is long enough to share out (a convolution's weight gradient: 64 x 27 outputs summed over
/// half a million pixels would otherwise run on one workgroup); None where one pass pays.
/// It depends on the shape alone (64x64 blocks whichever kernel runs), so a product sums in the
/// same order on every device and with every kernel.
pub(crate) fn split_k_chunk(dims: MatmulDims) -> Option<usize> {
    let blocks = dims.batch * dims.m.div_ceil(TILE) * dims.n.div_ceil(TILE);
    let splits = SPLIT_TARGET_WORKGROUPS
        .div_ceil(blocks.max(1))
        .min(dims.k / MIN_SPLIT_K);
    (splits >= 2).then(|| dims.k.div_ceil(splits).next_multiple_of(TILE_K))
}

/// Which block product runs a matmul. `LOCKSTEP_WGPU_MATMUL` (`auto`, `tile64`, `tile128`,
/// `tile64x128`, `tile128k16`) forces one for the process; [`crate::matmul_with`] for one
/// product. Where the adapter lacks the workgroup memory a kernel needs, the next smaller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// By the shape alone: [`MatmulKernel::for_shape`].
    Auto,
    /// 64x64 blocks, 4x4 per invocation (`matmul`, `matmul_split`).
    Tile64,
    /// 128x128 blocks, 8x8 per invocation, double-buffered, staged along each operand's
    /// contiguous axis (`matmul_wide`, `matmul_wide_split`).
    Tile128,
    /// The same kernel on 64x128 blocks (64 rows), 4x8 per invocation: for outputs of 64 rows.
    Tile64x128,
    /// `Tile128` with a k step of 16, half the barriers (32 KiB of workgroup memory).
    Tile128K16,
}

impl MatmulKernel {
    pub const ALL: [MatmulKernel; 5] = [
        MatmulKernel::Auto,
        MatmulKernel::Tile64,
        MatmulKernel::Tile128,
        MatmulKernel::Tile64x128,
        MatmulKernel::Tile128K16,
    ];

    /// The name `LOCKSTEP_WGPU_MATMUL` takes.
    pub fn name(self) -> &'static str {
        match self {
            MatmulKernel::Auto => "auto",
            MatmulKernel::Tile64 => "tile64",
            MatmulKernel::Tile128 => "tile128",
            MatmulKernel::Tile64x128 => "tile64x128",
            MatmulKernel::Tile128K16 => "tile128k16",
        }
    }

    /// `LOCKSTEP_WGPU_MATMUL`, read once: `Auto` where it is unset or names no kernel (said once).
    pub fn from_env() -> MatmulKernel {
        static CHOSEN: OnceLock<MatmulKernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("LOCKSTEP_WGPU_MATMUL") {
            Err(_) => MatmulKernel::Auto,
            Ok(name) => MatmulKernel::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(|| {
                    eprintln!(
                        "lockstep: LOCKSTEP_WGPU_MATMUL={name:?} is none of auto, tile64, tile128, tile64x128, tile128k16; ignored"
                    );
                    MatmulKernel::Auto
                }),
        })
    }

    /// The kernel `Auto` runs for `dims`, from the shape alone (one shape, one kernel): the
    /// first of 128x128 and 64x128 blocks that pads the output little (128 rows would double an
    /// output of 64) and has workgroups enough, over the splits of k where it is split, to fill a
    /// large GPU; else 64x64.
    pub fn for_shape(dims: MatmulDims) -> MatmulKernel {
        let padded = |rows: usize, cols: usize| dims.m.next_multiple_of(rows) * dims.n.next_multiple_of(cols);
        let splits = split_k_chunk(dims).map_or(1, |chunk| dims.k.div_ceil(chunk));
        let fits = |rows: usize, cols: usize| {
            let groups = dims.batch * dims.m.div_ceil(rows) * dims.n.div_ceil(cols) * splits;
            8 * padded(rows, cols) <= 9 * padded(TILE, TILE) && groups >= WIDE_MIN_GROUPS
        };
        if fits(WIDE, WIDE) {
            MatmulKernel::Tile128
        } else if fits(WIDE / 2, WIDE) {
            MatmulKernel::Tile64x128
        } else {
            MatmulKernel::Tile64
        }
    }
}

/// The entry points of one block product, its output block's rows and columns, and its pipeline
/// constants.
struct Product {
    whole: &'static str,
    split: &'static str,
    block: (usize, usize),
    constants: Vec<(&'static str, f64)>,
}

impl Product {
    fn variant(&self, entry: &'static str, t: &'static str) -> Variant {
        let mut v = Variant::new("matmul", entry, &[t]);
        for &(name, value) in &self.constants {
            v = v.constant(name, value);
        }
        v
    }
}

/// The params every product shader starts with: [m, n, k, lhs offset, lhs batch/m/k strides,
/// rhs offset, rhs batch/k/n strides, batch].
pub(crate) fn product_params(ll: &Layout, rl: &Layout, dims: MatmulDims) -> Result<Vec<u32>> {
    const OP: &str = "matmul";
    let MatmulDims { batch, m, n, k } = dims;
    let mut params = vec![to_u32(OP, m)?, to_u32(OP, n)?, to_u32(OP, k)?];
    for layout in [ll, rl] {
        params.push(to_u32(OP, layout.offset)?);
        for &s in &layout.strides {
            params.push(to_u32(OP, s)?);
        }
    }
    params.push(to_u32(OP, batch)?);
    Ok(params)
}

/// Whether an operand's staging reads along k: where k is its contiguous axis and the block's
/// edge (m or n) is not (a degenerate axis may have any stride).
fn along_k(k_stride: usize, edge_stride: usize) -> bool {
    k_stride == 1 && edge_stride != 1
}

impl WgpuBackend {
    pub(crate) fn gemm(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        if let Some(out) = self.gemm_cooperative(lhs, ll, rhs, rl, dims, split_k_chunk(dims).is_none())? {
            return Ok(out);
        }
        self.gemm_by(MatmulKernel::from_env(), lhs, ll, rhs, rl, dims)
    }

    /// The product with `kernel`'s block product (resolved for the shape where `Auto`).
    pub fn gemm_by(
        &self,
        kernel: MatmulKernel,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        // bf16 operands are read from their packed words, and the product written two elements
        // a word where no pair straddles two rows of a block (n even, or a split product, whose
        // sums are written in flat order); else f32 copies, rounded after.
        let packed = dims.n.is_multiple_of(2) || split_k_chunk(dims).is_some();
        if lhs.dtype() == DType::BF16 && rhs.dtype() == DType::BF16 && packed {
            return self.gemm_with(Some(kernel), lhs, ll, rhs, rl, dims);
        }
        self.in_f32("matmul", [lhs, rhs], |[lhs, rhs]| {
            self.gemm_with(Some(kernel), lhs, ll, rhs, rl, dims)
        })
    }

    /// The same product with the untiled kernel: the baseline the benchmark compares against.
    pub fn matmul_naive(
        &self,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        self.in_f32("matmul", [lhs, rhs], |[lhs, rhs]| {
            self.gemm_with(None, lhs, ll, rhs, rl, dims)
        })
    }

    /// The product with `kernel`'s block product, or the naive kernel where None.
    fn gemm_with(
        &self,
        kernel: Option<MatmulKernel>,
        lhs: &BufferRef,
        ll: &Layout,
        rhs: &BufferRef,
        rl: &Layout,
        dims: MatmulDims,
    ) -> Result<BufferRef> {
        const OP: &str = "matmul";
        let MatmulDims { batch, m, n, k } = dims;
        if ll.dims() != [batch, m, k] || rl.dims() != [batch, k, n] {
            return Err(Error::invalid(
                OP,
                format!("layouts {:?} and {:?} do not match {dims:?}", ll.dims(), rl.dims()),
            ));
        }
        let a = self.operand(OP, lhs, Some(ll))?;
        let b = self.operand(OP, rhs, Some(rl))?;
        if a.dtype() != b.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        let t = self.element_type(OP, a.dtype())?;
        let out = self.alloc("matmul", a.dtype(), batch * m * n)?;
        if batch * m * n == 0 {
            return Ok(out);
        }
        let mut params = product_params(ll, rl, dims)?;
        let split = kernel.and_then(|_| split_k_chunk(dims));
        params.push(to_u32(OP, split.unwrap_or(k))?);
        let wide = |rows: usize, wide_k: usize| Product {
            whole: "matmul_wide",
            split: "matmul_wide_split",
            block: (rows, WIDE),
            constants: vec![
                ("WIDE_ROWS", rows as f64),
                ("WIDE_K", wide_k as f64),
                (
                    "LHS_ALONG_K",
                    f64::from(u8::from(along_k(ll.strides[2], ll.strides[1]))),
                ),
                (
                    "RHS_ALONG_K",
                    f64::from(u8::from(along_k(rl.strides[1], rl.strides[2]))),
                ),
            ],
        };
        let product = match kernel.map(|k| self.resolve(k, dims)) {
            // (The naive kernel is never split.)
            None => Product {
                whole: "matmul_naive",
                split: "matmul_naive",
                block: (NAIVE_EDGE, NAIVE_EDGE),
                constants: vec![],
            },
            Some(MatmulKernel::Tile128) => wide(WIDE, 8),
            Some(MatmulKernel::Tile64x128) => wide(WIDE / 2, 8),
            Some(MatmulKernel::Tile128K16) => wide(WIDE, 16),
            // Tile64 (`resolve` never answers Auto).
            Some(_) => Product {
                whole: "matmul",
                split: "matmul_split",
                block: (TILE, TILE),
                constants: vec![],
            },
        };
        // One workgroup per output block, numbered through the batch (folded into y as needed).
        let blocks = batch * m.div_ceil(product.block.0) * n.div_ceil(product.block.1);
        let Some(chunk) = split else {
            self.launch(
                &product.variant(product.whole, t),
                &params,
                &[(1, a), (2, b), (3, &out)],
                self.groups(OP, blocks)?,
            )?;
            return Ok(out);
        };
        // Each split's blocks write their f32 partial products, which one more pass adds up.
        let splits = k.div_ceil(chunk);
        let outputs = batch * m * n;
        let partials = self.alloc("matmul", DType::F32, splits * outputs)?;
        self.launch(
            &product.variant(product.split, t),
            &params,
            &[(1, a), (2, b), (4, &partials)],
            self.groups(OP, splits * blocks)?,
        )?;
        self.launch(
            &Variant::new(OP, "matmul_split_sum", &[t]),
            &[to_u32(OP, outputs)?, to_u32(OP, splits)?],
            &[(3, &out), (4, &partials)],
            self.word_grid(OP, a.dtype(), outputs)?,
        )?;
        Ok(out)
    }

    /// `kernel` as it runs here: `Auto` resolved for the shape, and a wide kernel's k step of 16
    /// (then the wide kernel) given up on an adapter with too little workgroup memory for it.
    fn resolve(&self, kernel: MatmulKernel, dims: MatmulDims) -> MatmulKernel {
        let fits = |wide_k| wide_workgroup_bytes(wide_k) <= self.limits().max_compute_workgroup_storage_size as usize;
        match kernel {
            MatmulKernel::Auto => self.resolve(MatmulKernel::for_shape(dims), dims),
            MatmulKernel::Tile128K16 if !fits(16) => self.resolve(MatmulKernel::Tile128, dims),
            MatmulKernel::Tile128 | MatmulKernel::Tile64x128 if !fits(8) => MatmulKernel::Tile64,
            chosen => chosen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: usize, m: usize, n: usize, k: usize) -> MatmulDims {
        MatmulDims { batch, m, n, k }
    }

    #[test]
    fn splits_k_where_the_output_has_few_blocks_and_k_is_long() {
        // ResNet-18's conv1 weight gradient at batch 512: one block, 512 chunks of 1024.
        assert_eq!(split_k_chunk(dims(1, 64, 27, 524_288)), Some(1024));
        // layer1's: 9 blocks, 57 splits of k rounded up to a multiple of TILE_K.
        let chunk = split_k_chunk(dims(1, 64, 576, 524_288)).unwrap();
        assert_eq!((chunk % TILE_K, 524_288usize.div_ceil(chunk)), (0, 57));
        // Enough blocks already, or too short a k to share out: one pass.
        assert_eq!(split_k_chunk(dims(1, 512, 4608, 8192)), None);
        assert_eq!(split_k_chunk(dims(8, 64, 64, 8192)).map(|c| 8192 / c), Some(8));
        assert_eq!(split_k_chunk(dims(1, 64, 64, 2047)), None);
    }

    #[test]
    fn auto_takes_128_blocks_where_they_fill_a_gpu_and_pad_little() {
        use MatmulKernel::{Tile64, Tile64x128, Tile128};
        // A square 8192 product: 4096 blocks of 128.
        assert_eq!(MatmulKernel::for_shape(dims(1, 8192, 8192, 8192)), Tile128);
        // ResNet-18's layer4 forward at batch 512: 512 x 25088 outputs, 784 blocks.
        assert_eq!(MatmulKernel::for_shape(dims(1, 512, 25_088, 4608)), Tile128);
        // Its layer3 weight gradient: 36 blocks in 4 splits of k.
        assert_eq!(MatmulKernel::for_shape(dims(1, 256, 2304, 100_352)), Tile128);
        // 64 rows: 128x128 blocks would compute twice the output, 64x128 ones none of it (and
        // layer1's weight gradient 640 columns of 576, in 57 splits).
        assert_eq!(MatmulKernel::for_shape(dims(1, 64, 1 << 20, 576)), Tile64x128);
        assert_eq!(MatmulKernel::for_shape(dims(1, 64, 576, 524_288)), Tile64x128);
        // conv1's: 27 columns, which 128 would pad fourfold.
        assert_eq!(MatmulKernel::for_shape(dims(1, 64, 27, 524_288)), Tile64);
        // 64 blocks of 128x128 are too few to fill a GPU, 128 of 64x128 enough; 32 are not.
        assert_eq!(MatmulKernel::for_shape(dims(1, 1024, 1024, 1024)), Tile64x128);
        assert_eq!(MatmulKernel::for_shape(dims(1, 512, 512, 1024)), Tile64);
        // Batches count: 16 x 8 x 8 blocks.
        assert_eq!(MatmulKernel::for_shape(dims(16, 1024, 1024, 64)), Tile128);
    }

    #[test]
    fn staging_reads_along_k_only_where_k_alone_is_contiguous() {
        assert!(along_k(1, 576));
        assert!(!along_k(576, 1));
        assert!(!along_k(1, 1));
        assert!(!along_k(3, 7));
    }
}
