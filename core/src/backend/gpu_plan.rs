//! How the GPU backends (wgpu and CUDA alike) lay out work whose result must not depend on the
//! device: decided from shapes alone, in one place, so every GPU sums in the same order.

use super::LayerNormAffine;

/// Below this many outputs a reduction splits each output's reduced elements into chunks: a
/// workgroup per output would leave most of a large GPU idle (`sum_all` ran on 1 of 132 SMs).
const FEW_OUTPUTS: usize = 1024;
/// Reduced elements a chunk holds at least (16 per invocation), so splitting pays for its second pass.
const MIN_CHUNK: usize = 4096;

/// Reduced elements per workgroup: all of them, or a chunk such that the outputs' chunks number
/// about `FEW_OUTPUTS` in all. From the shape alone, so every device sums in the same order.
pub fn chunk_len(n_out: usize, n_red: usize) -> usize {
    let chunks = (FEW_OUTPUTS / n_out.max(1)).min(n_red / MIN_CHUNK);
    if chunks < 2 {
        return n_red.max(1);
    }
    n_red.div_ceil(chunks)
}

/// Columns a column reduction needs at least: a warp's worth, so its threads are not idle.
const MIN_COLUMNS: usize = 32;

/// Whether a reduction runs as a column reduction (a thread per kept element reading neighbouring
/// addresses): its kept elements, after merging, one run of stride 1 (`kept_strides` `[1]`), at
/// least `MIN_COLUMNS` of them.
pub fn reduces_by_columns(kept_strides: &[usize], n_out: usize) -> bool {
    kept_strides == [1] && n_out >= MIN_COLUMNS
}

/// Threads a column reduction aims to keep busy (about two H100s' worth of resident threads).
const COLUMN_THREADS: usize = 1 << 18;

/// Reduced elements below which a column reduction takes them all in one chunk: a second pass
/// to fold chunks costs more than the short loop it would split.
const ONE_COLUMN_CHUNK: usize = 256;

/// The reduced elements one thread of a column reduction (kept elements contiguous: a thread per
/// column, neighbours reading neighbouring addresses) runs through in order, for `n_out` columns
/// of `n_red`: all of them up to `ONE_COLUMN_CHUNK`, else enough chunks to reach
/// `COLUMN_THREADS`, at least 16 elements each, at most 65535 chunks (a grid dimension). From
/// the shape alone, like `chunk_len`.
pub fn column_chunk_len(n_out: usize, n_red: usize) -> usize {
    if n_red <= ONE_COLUMN_CHUNK {
        return n_red.max(1);
    }
    let chunks = (COLUMN_THREADS / n_out.max(1)).clamp(1, n_red.div_ceil(16).max(1));
    n_red.div_ceil(chunks).max(n_red.div_ceil(65535)).max(1)
}

/// Elements each invocation of a reduction's group takes in on its own before the group combines:
/// the combine's rounds of workgroup barriers cost more than a longer loop (on lavapipe a sum of
/// 32-element rows took 2.7 s with 256 invocations a row, 90 ms at 8 elements each, 65 ms at 32).
const PER_LANE: usize = 32;

/// Invocations that share one reduction of `len` elements: a power of two, all `workgroup` for
/// long reductions and fewer for short ones (up to `PER_LANE` elements each), so a workgroup
/// serves several short outputs instead of leaving most of its invocations idle. From the shape
/// alone, like `chunk_len`.
pub fn group_len(len: usize, workgroup: usize) -> usize {
    len.div_ceil(PER_LANE).next_power_of_two().min(workgroup)
}

/// Row chunks a per-column sum over rows is cut into (layer norm's weight and bias gradients)
/// number at most this many, so their partial sums `[chunks, cols]` stay small...
const ROW_CHUNKS: usize = 1024;
/// ...and hold at least this many rows each, so the partials stay a fraction of the input.
const MIN_CHUNK_ROWS: usize = 8;

/// Rows per chunk of a per-column sum over `rows` rows: a group sums its chunk's rows in order,
/// then a second pass sums the chunks in order. From the shape alone, like `chunk_len`.
pub fn rows_per_chunk(rows: usize) -> usize {
    rows.div_ceil(ROW_CHUNKS).max(MIN_CHUNK_ROWS)
}

/// Rows each group of LayerNorm's backward pass takes: a chunk of `rows_per_chunk` rows when it
/// sums the weight's and bias's gradients over the columns, else one row.
pub fn layer_norm_chunk_rows(affine: &LayerNormAffine<'_>, rows: usize) -> usize {
    if affine.any() { rows_per_chunk(rows) } else { 1 }
}

/// The flags word LayerNorm's GPU kernels read (layer_norm.wgsl and layer_norm.cu alike): 1 a
/// weight, 2 a bias, 4 the backward pass sums the columns (there is a weight or a bias).
pub fn layer_norm_flags(affine: &LayerNormAffine<'_>, backward: bool) -> u32 {
    u32::from(affine.weight.is_some())
        | u32::from(affine.bias.is_some()) << 1
        | u32::from(backward && affine.any()) << 2
}

/// Whether linking sources into per-id lists costs fewer loop iterations than scanning every
/// source for each of `dst_len` destination elements: each of `positions` sources searches forward
/// for the next with its id (at worst to the end of its column: src_dim / 2 on average), then
/// each destination walks its list. Scanning wins where sources are few (a cross-entropy's
/// gather backward: one per row), linking where the destination is wide (an embedding's backward).
pub fn linking_pays(dst_len: usize, src_dim: usize, positions: usize) -> bool {
    let scanning = dst_len.saturating_mul(src_dim);
    let linking = positions.saturating_mul(src_dim) / 2 + 2 * dst_len;
    linking < scanning
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_chunks_cover_the_reduced_elements_within_a_grid_dimension() {
        for (n_out, n_red) in [
            (768, 16384),
            (32, 1),
            (50257, 7),
            (64, 1 << 30),
            (1 << 20, 100),
            (64, 300),
            (64, 256),
        ] {
            let len = column_chunk_len(n_out, n_red);
            let chunks = n_red.div_ceil(len);
            assert!(len >= 1 && chunks <= 65535, "{n_out} x {n_red}: {len}");
            assert!(chunks * len >= n_red && (chunks - 1) * len < n_red);
            // Enough threads, or chunks no shorter than 16 elements.
            assert!(
                n_out * chunks >= COLUMN_THREADS / 2 || len >= 16 || len == n_red,
                "{n_out} x {n_red}: {len}"
            );
            // Short columns whole.
            assert!(
                n_red > ONE_COLUMN_CHUNK || len == n_red.max(1),
                "{n_out} x {n_red}: {len}"
            );
        }
        // A bias gradient of GPT-2: 768 columns over 16384 tokens, in 335 chunks.
        assert_eq!(column_chunk_len(768, 16384), 49);
    }

    #[test]
    fn short_reductions_share_a_workgroup_and_long_ones_fill_it() {
        for (len, group) in [
            (0, 1),
            (1, 1),
            (32, 1),
            (33, 2),
            (300, 16),
            (1024, 32),
            (4096, 128),
            (1 << 20, 256),
        ] {
            assert_eq!(group_len(len, 256), group, "{len} elements");
        }
        for len in 1..5000 {
            let group = group_len(len, 256);
            assert!(group.is_power_of_two() && len.div_ceil(group) <= PER_LANE.max(len / 256 + 1));
        }
    }

    #[test]
    fn row_chunks_are_few_and_never_tiny() {
        assert_eq!(rows_per_chunk(0), 8);
        assert_eq!(rows_per_chunk(45), 8);
        assert_eq!(rows_per_chunk(16 * 1024), 16);
        for rows in [1, 9, 8191, 8193, 1 << 20] {
            let len = rows_per_chunk(rows);
            assert!(len >= 8 && rows.div_ceil(len) <= 1024, "{rows} rows: {len} a chunk");
        }
    }

    #[test]
    fn only_few_long_outputs_split_and_no_chunk_is_empty() {
        assert_eq!(chunk_len(1, 0), 1);
        assert_eq!(chunk_len(1, 8191), 8191);
        assert_eq!(chunk_len(2048, 1 << 24), 1 << 24);
        assert_eq!(chunk_len(1, 1 << 24), 1 << 14);
        for (n_out, n_red) in [(1, 3 << 20), (3, 1_000_001), (100, 65_536), (1, 8192)] {
            let len = chunk_len(n_out, n_red);
            let chunks = n_red.div_ceil(len);
            assert!(
                chunks >= 2 && n_out * chunks <= 1024,
                "{n_out} x {n_red}: {chunks} chunks"
            );
            assert!(
                (chunks - 1) * len < n_red && len >= 4096,
                "{n_out} x {n_red}: chunks of {len}"
            );
        }
    }
}
