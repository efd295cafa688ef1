// causal_attention: softmax(q·kᵀ·scale, the future masked)·v in one pass over key blocks
// (flash-attention 2), never materialising the t×t scores; its backward pass recomputes the
// weights from the saved row log-sum-exp. bf16 and f16 inputs on tensor cores (mma.sync
// m16n8k16, f32 accumulators); f32 keeps the composed path (the backend declines).
//
// Layouts (no copies around the kernels): q, k, v are read from the fused projection
// qkv [batch, t, 3, heads, d]; y and dy are [batch, t, heads, d] (what the output projection
// reads); lse is f32 [batch, heads, t], and so are the backward's row statistics, (lse · log2 e,
// dot) pairs; dqkv is [batch, t, 3, heads, d], each
// slot written by exactly one thread (no atomics: the sums run in one fixed order, bit-exact
// from run to run).
//
// A block is 4 warps over 64 resident rows (16 a warp); the other operand streams through
// shared memory in tiles of `streamed_rows` rows, copied by cp.async. With one stage a tile is
// copied, then used; the pipelined kernels (`_pipelined`: two stages) copy the next tile while
// the warps work on this one, in half-height tiles where two stages of full ones would not fit
// (and in one stage where neither fits: head dim 128's backward). Only the tiles that straddle
// the diagonal (or t) are masked. The fragment and ldmatrix index maps are mirrored, and
// checked against a plain product, by kernels/src/attention_layout.rs.
//
// Exponentials are ex2.approx on scores pre-multiplied by log2(e) (about 2 ulp in f32; the
// probabilities are then rounded to bf16/f16 for the second product, as in every flash
// attention). A NaN (or +inf) score makes its whole row NaN, as the composed softmax does;
// masked positions are set, not multiplied, so a NaN never leaks into a row that cannot see it.

#define ATTENTION_WARPS 4
#define ATTENTION_ROWS 64
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Whether `resident` tiles of 64 rows and `stages` pairs of streamed tiles of `rows` rows, d + 8
// halves a row, fit 48 KB of static shared memory with room to spare for the row statistics.
__host__ __device__ constexpr bool tiles_fit(int d, int resident, int stages, int rows) {
    return (resident * 64 + stages * 2 * rows) * (d + 8) * 2 <= 47 * 1024;
}
// The largest streamed tile (64, 32 or 16 rows) that fits, 0 if none does.
__host__ __device__ constexpr int streamed_rows(int d, int resident, int stages) {
    return tiles_fit(d, resident, stages, 64)   ? 64
           : tiles_fit(d, resident, stages, 32) ? 32
           : tiles_fit(d, resident, stages, 16) ? 16
                                                : 0;
}
// The stages a kernel runs: the `wanted` ones if their tiles fit, else one.
__host__ __device__ constexpr int stages_that_fit(int d, int resident, int wanted) {
    return streamed_rows(d, resident, wanted) > 0 ? wanted : 1;
}

// ---- tensor-core building blocks ----------------------------------------------------------

// The CPU emulator (backend-cuda/emulator) defines these itself: the matrix instructions and ex2
// in warp_matrix.h (from the PTX ISA's layouts), cp.async in async_copy.h.
#ifndef LOCKSTEP_EMULATED
template <typename T> __device__ __forceinline__ void mma_16816(float c[4], const u32 a[4], u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma_16816<bf16>(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma_16816<f16>(float c[4], const u32 a[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// cp.async: `bytes` bytes from global memory to shared memory without passing through
// registers, zero-filled past `src_bytes` (0 for a row past t); landed once a wait_group
// covering its commit_group returns, for the issuing thread only (a barrier shares them).
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void copy_async_8(void* dst, const void* src, u32 src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(shared_address(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `N` of the thread's newest committed groups are still in flight.
template <int N> __device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// Two values as one register of two 16-bit elements, the lower column in the low half, each
// rounded as from_f32 rounds (a NaN keeps its payload): the stored outputs.
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi) {
    return (u32)from_f32<T>(lo).bits | ((u32)from_f32<T>(hi).bits << 16);
}

// Two instructions with a portable twin, which the emulator runs:
// - pack2_operand: pack2 for a product's operand (the weights P, their gradient dS), in one cvt
//   for both values where from_f32's bf16 rounding takes about ten: the same roundings, except
//   that a NaN becomes the canonical one, which no product can tell apart;
// - max_or_nan: max_nan (the larger of a and b, NaN if either is) in one instruction, its NaN
//   the canonical one, which only ever makes a row NaN.
#ifdef LOCKSTEP_EMULATED
template <typename T> __device__ __forceinline__ u32 pack2_operand(float lo, float hi) { return pack2<T>(lo, hi); }
__device__ __forceinline__ float max_or_nan(float a, float b) { return max_nan(a, b); }
#else
template <typename T> __device__ __forceinline__ u32 pack2_operand(float lo, float hi);
// cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a in the upper half of d and b in the lower.
template <> __device__ __forceinline__ u32 pack2_operand<bf16>(float lo, float hi) {
    u32 packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}
template <> __device__ __forceinline__ u32 pack2_operand<f16>(float lo, float hi) {
    u32 packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}
__device__ __forceinline__ float max_or_nan(float a, float b) {
    float m;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(m) : "f"(a), "f"(b));
    return m;
}
#endif

// Where lane `lane` points ldmatrix.x4 in a row-major tile (pitch in halves). `rows_first`: the
// four 8x8 matrices are (rows 0-7, 8-15) x (cols 0-7, 8-15) in that order: an A operand, or with
// .trans two n-blocks of a B operand stored [k][n]. Otherwise (cols 0-7, 8-15) come first: two
// n-blocks of a B operand stored [n][k].
__device__ __forceinline__ u32 x4_offset(u32 lane, u32 row0, u32 col0, u32 pitch, bool rows_first) {
    u32 row = rows_first ? (lane & 7) + ((lane >> 3) & 1) * 8 : (lane & 7) + (lane >> 4) * 8;
    u32 col = rows_first ? (lane >> 4) * 8 : ((lane >> 3) & 1) * 8;
    return (row0 + row) * pitch + col0 + col;
}

// An accumulator element's place in the warp's 16 x n tile: register e of n-block nb.
__device__ __forceinline__ u32 acc_row(u32 lane, int e) { return (lane >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ u32 acc_col(u32 lane, int nb, int e) { return nb * 8 + (lane & 3) * 2 + (e & 1); }

// acc (16 x N) += A · Bᵀ for A the 16 x D rows at `a` and B the N x D rows at `b`, both tiles
// of pitch D + 8 in shared memory (S = Q·Kᵀ, dP = dY·Vᵀ and their transposes).
template <typename T, int D, int N>
__device__ __forceinline__ void warp_product_abt(float acc[N / 8][4], const u16* a, const u16* b, u32 lane) {
    constexpr u32 P = D + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 af[4];
        ldmatrix_x4(af, a + x4_offset(lane, 0, kk * 16, P, true));
#pragma unroll
        for (int j = 0; j < N / 16; ++j) {
            u32 bf[4];
            ldmatrix_x4(bf, b + x4_offset(lane, j * 16, kk * 16, P, false));
            mma_16816<T>(acc[2 * j], af, bf[0], bf[1]);
            mma_16816<T>(acc[2 * j + 1], af, bf[2], bf[3]);
        }
    }
}

// acc (16 x D) += P · B for P the 16 x N accumulator tile `p` (rounded to T) and B the N x D rows
// at `b` (O += P·V, dQ += dS·K, dV += Pᵀ·dY, dK += dSᵀ·Q). P's accumulator layout is already the
// A operand's: n-blocks 2kk and 2kk + 1 hold k-step kk's columns 0-7 and 8-15.
template <typename T, int D, int N>
__device__ __forceinline__ void warp_product_pb(float acc[D / 8][4], const float p[N / 8][4], const u16* b, u32 lane) {
    constexpr u32 P = D + 8;
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
        u32 af[4] = {pack2_operand<T>(p[2 * kk][0], p[2 * kk][1]), pack2_operand<T>(p[2 * kk][2], p[2 * kk][3]),
                     pack2_operand<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                     pack2_operand<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {
            u32 bf[4];
            ldmatrix_x4_trans(bf, b + x4_offset(lane, kk * 16, j * 16, P, true));
            mma_16816<T>(acc[2 * j], af, bf[0], bf[1]);
            mma_16816<T>(acc[2 * j + 1], af, bf[2], bf[3]);
        }
    }
}

template <int N> __device__ __forceinline__ void zero_acc(float acc[N / 8][4]) {
#pragma unroll
    for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nb][e] = 0.0f;
}

// ---- global memory ------------------------------------------------------------------------

// Issues the copies of rows row0 .. row0 + rows of one head (row r at src + r * stride) into a
// tile of pitch D + 8, 16 bytes each; rows at or past t land as zeros (their copies point at
// row 0, which exists, and take no bytes from it).
template <int D>
__device__ __forceinline__ void issue_tile(u16* tile, const u16* src, u64 stride, u32 row0, u32 rows, u32 t) {
    constexpr u32 CHUNKS = D / 8;
    for (u32 c = threadIdx.x; c < rows * CHUNKS; c += blockDim.x) {
        u32 r = c / CHUNKS, col = (c % CHUNKS) * 8;
        bool in = row0 + r < t;
        copy_async_16(tile + r * (D + 8) + col, src + (in ? (u64)(row0 + r) * stride : 0) + col, in ? 16 : 0);
    }
}

// Issues the copies of the row statistics (lse in base 2, dot) of rows row0 .. row0 + n; rows
// past t land as zeros.
__device__ __forceinline__ void issue_stats(float2* dst, const float2* stats, u64 base, u32 row0, u32 n, u32 t) {
    for (u32 r = threadIdx.x; r < n; r += blockDim.x) {
        bool in = row0 + r < t;
        copy_async_8(dst + r, stats + base + (in ? row0 + r : 0), in ? 8 : 0);
    }
}

// The streamed-tile loop every kernel runs: for each tile start `row` (first, first + ROWS, …
// below `end`), `issue(row, stage)` copies the tile into stage buffer `stage`, and
// `use(row, stage)` runs once the tile has landed for the whole block. With two stages the next
// tile's copies are in flight while the block uses this one. Whatever the block issued before
// (its resident tiles) lands before the first use.
template <int STAGES, int ROWS, typename Issue, typename Use>
__device__ __forceinline__ void stream_tiles(u32 first, u32 end, Issue issue, Use use) {
    if constexpr (STAGES == 2) {
        if (first < end) issue(first, 0);
    }
    copy_async_commit();
    int stage = 0;
    for (u32 row = first; row < end; row += ROWS) {
        __syncthreads();  // every warp is done with the buffers about to be refilled
        if constexpr (STAGES == 1) {
            issue(row, 0);
            copy_async_commit();
            copy_async_wait<0>();
        } else if (row + ROWS < end) {
            issue(row + ROWS, stage ^ 1);
            copy_async_commit();
            copy_async_wait<1>();
        } else {
            copy_async_wait<0>();
        }
        __syncthreads();  // every thread's copies of this tile have landed
        use(row, stage);
        if constexpr (STAGES == 2) stage ^= 1;
    }
}

// One head of one sequence: its rows in qkv (q, k, v slots), in y-shaped tensors, in the row
// statistics.
struct Head {
    u64 qkv[3];   // first element of slot 0, 1, 2 of row 0
    u64 qkv_stride;
    u64 out;      // first element of row 0 in [batch, t, heads, d]
    u64 out_stride;
    u64 stats;    // first row in [batch, heads, t]
};

template <int D> __device__ __forceinline__ Head head_of(u32 bh, u32 heads, u32 t) {
    u32 b = bh / heads, h = bh % heads;
    Head at;
#pragma unroll
    for (int s = 0; s < 3; ++s) at.qkv[s] = (((u64)b * t * 3 + s) * heads + h) * D;
    at.qkv_stride = (u64)3 * heads * D;
    at.out = ((u64)b * t * heads + h) * D;
    at.out_stride = (u64)heads * D;
    at.stats = (u64)bh * t;
    return at;
}

// Writes the warp's 16 x D accumulator tile times `factor` to rows row0 + 0..15 (those below t)
// at dst + row * stride.
template <typename T, int D>
__device__ __forceinline__ void store_rows(u16* dst, u64 stride, const float acc[D / 8][4], const float factor[2],
                                           u32 row0, u32 t, u32 lane) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        u32 row = row0 + acc_row(lane, half * 2);
        if (row >= t) continue;
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) {
            u32 col = acc_col(lane, nb, 0);
            *(u32*)(dst + (u64)row * stride + col) =
                pack2<T>(acc[nb][half * 2] * factor[half], acc[nb][half * 2 + 1] * factor[half]);
        }
    }
}

// The larger of a and b across the 4 lanes holding one accumulator row, NaN if any is.
__device__ __forceinline__ float quad_max(float v) {
    v = max_or_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return max_or_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---- forward ------------------------------------------------------------------------------

// Scores times scale·log2(e) in place, the future set to -inf where the tile straddles the
// diagonal (MASKED); the largest of each of the lane's two rows into tile_max.
template <int KV, bool MASKED>
__device__ __forceinline__ void scale_scores(float s[KV / 8][4], float tile_max[2], u32 k0, u32 row0, float scale2,
                                             u32 lane) {
#pragma unroll
    for (int nb = 0; nb < KV / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            bool future = MASKED && k0 + acc_col(lane, nb, e) > row0 + acc_row(lane, e);
            s[nb][e] = future ? -F32_INF : s[nb][e] * scale2;
            tile_max[e >> 1] = max_or_nan(tile_max[e >> 1], s[nb][e]);
        }
}

// Block (x: query block, latest first so the longest rows start first; y: batch·head).
template <typename T, int D, int STAGES>
__device__ __forceinline__ void attention_forward(T* y, float* lse, const T* qkv, u32 heads, u32 t, float scale) {
    constexpr int S = stages_that_fit(D, 1, STAGES);
    constexpr int KV = streamed_rows(D, 1, S);
    constexpr u32 P = D + 8;
    __shared__ __align__(16) u16 q_tile[ATTENTION_ROWS * P];
    __shared__ __align__(16) u16 k_tiles[S][KV * P];
    __shared__ __align__(16) u16 v_tiles[S][KV * P];
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 q0 = (gridDim.x - 1 - blockIdx.x) * ATTENTION_ROWS;
    const u32 warp_row0 = q0 + warp * 16;
    const Head at = head_of<D>(blockIdx.y, heads, t);
    const u16* src = (const u16*)qkv;
    issue_tile<D>(q_tile, src + at.qkv[0], at.qkv_stride, q0, ATTENTION_ROWS, t);

    const float scale2 = scale * LOG2E;
    float o[D / 8][4];
    zero_acc<D>(o);
    float row_max[2] = {-F32_INF, -F32_INF}, row_sum[2] = {0.0f, 0.0f};
    const u32 keys_end = min(q0 + ATTENTION_ROWS, t);
    auto issue = [&](u32 k0, int stage) {
        issue_tile<D>(k_tiles[stage], src + at.qkv[1], at.qkv_stride, k0, KV, t);
        issue_tile<D>(v_tiles[stage], src + at.qkv[2], at.qkv_stride, k0, KV, t);
    };
    auto use = [&](u32 k0, int stage) {
        if (k0 > warp_row0 + 15) return;  // every key of the tile is in this warp's future
        float s[KV / 8][4];
        zero_acc<KV>(s);
        warp_product_abt<T, D, KV>(s, q_tile + warp * 16 * P, k_tiles[stage], lane);
        float tile_max[2] = {-F32_INF, -F32_INF};
        if (k0 + KV - 1 > warp_row0) scale_scores<KV, true>(s, tile_max, k0, warp_row0, scale2, lane);
        else scale_scores<KV, false>(s, tile_max, k0, warp_row0, scale2, lane);
        float rescale[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float m = max_or_nan(row_max[half], quad_max(tile_max[half]));
            // The first tile always holds key 0, so m is finite (or NaN) from then on.
            rescale[half] = ex2(row_max[half] - m);
            row_max[half] = m;
            row_sum[half] *= rescale[half];
        }
#pragma unroll
        for (int nb = 0; nb < KV / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[nb][e] = ex2(s[nb][e] - row_max[e >> 1]);
                row_sum[e >> 1] += s[nb][e];
            }
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[nb][e] *= rescale[e >> 1];
        warp_product_pb<T, D, KV>(o, s, v_tiles[stage], lane);
    };
    stream_tiles<S, KV>(0, keys_end, issue, use);
    float inverse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float total = quad_sum(row_sum[half]);
        inverse[half] = 1.0f / total;
        u32 row = warp_row0 + acc_row(lane, half * 2);
        if ((lane & 3) == 0 && row < t) lse[at.stats + row] = (row_max[half] + log2f(total)) * LN2;
    }
    store_rows<T, D>((u16*)y + at.out, at.out_stride, o, inverse, warp_row0, t, lane);
}

// ---- backward -----------------------------------------------------------------------------

// stats[row] = (lse · log2(e), sum over d of dy · y) for each (batch, head, position), what the
// backward kernels read of each row: one warp a row.
template <typename T>
__device__ __forceinline__ void attention_row_stats(float2* stats, const float* lse, const T* y, const T* dy, u32 rows,
                                                    u32 heads, u32 t, u32 d) {
    u32 lane = threadIdx.x % 32;
    for (u32 row = (blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows; row += gridDim.x * blockDim.x / 32) {
        // row walks [batch, t, heads] (y's order); the statistics are [batch, heads, t].
        u32 h = row % heads, pos = (row / heads) % t, b = row / heads / t;
        float sum = 0.0f;
        for (u32 c = lane; c < d; c += 32) sum += to_f32(y[(u64)row * d + c]) * to_f32(dy[(u64)row * d + c]);
        for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, width);
        u64 at = ((u64)b * heads + h) * t + pos;
        if (lane == 0) stats[at] = make_float2(lse[at] * LOG2E, sum);
    }
}

// p = exp(s·scale − lse) in `s` and ds = p·(dp − dot) in `dp`, element by element; where MASKED,
// masked places (a key after its query, a query past t) exactly 0. `transposed`: rows are keys
// and columns queries, and `stats` is indexed by column instead of row.
template <int N, bool MASKED>
__device__ __forceinline__ void weights_from_scores(float s[N / 8][4], float dp[N / 8][4], const float2* stats,
                                                    u32 row0, u32 col0, u32 t, bool transposed, float scale2,
                                                    u32 lane) {
#pragma unroll
    for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            u32 r = acc_row(lane, e), c = acc_col(lane, nb, e);
            u32 query = transposed ? col0 + c : row0 + r, key = transposed ? row0 + r : col0 + c;
            float2 stat = stats[transposed ? c : r];
            bool seen = !MASKED || (key <= query && query < t);
            float p = seen ? ex2(s[nb][e] * scale2 - stat.x) : 0.0f;
            s[nb][e] = p;
            dp[nb][e] = seen ? p * (dp[nb][e] - stat.y) : 0.0f;
        }
}

// The weights and their gradient for one 16-row warp tile of S (or Sᵀ), from the tiles whose
// products give the scores (s = a_s·b_sᵀ) and the weights' output gradient (dp = a_dp·b_dpᵀ):
// p in `s`, ds in `dp`. Only a tile that straddles the diagonal or reaches t is masked.
template <typename T, int D, int N>
__device__ __forceinline__ void weights_and_grads(float s[N / 8][4], float dp[N / 8][4], const u16* a_s, const u16* b_s,
                                                  const u16* a_dp, const u16* b_dp, const float2* stats, u32 row0,
                                                  u32 col0, u32 t, bool transposed, float scale2, u32 lane) {
    zero_acc<N>(s);
    zero_acc<N>(dp);
    warp_product_abt<T, D, N>(s, a_s, b_s, lane);
    warp_product_abt<T, D, N>(dp, a_dp, b_dp, lane);
    // Queries and keys of the tile: 16 rows from row0, N columns from col0.
    u32 last_query = transposed ? col0 + N - 1 : row0 + 15, first_query = transposed ? col0 : row0;
    u32 last_key = transposed ? row0 + 15 : col0 + N - 1;
    if (last_key <= first_query && last_query < t)
        weights_from_scores<N, false>(s, dp, stats, row0, col0, t, transposed, scale2, lane);
    else
        weights_from_scores<N, true>(s, dp, stats, row0, col0, t, transposed, scale2, lane);
}

// dQ for one query block: its weights recomputed against every key block up to the diagonal.
template <typename T, int D, int STAGES>
__device__ __forceinline__ void attention_dq(T* dqkv, const T* qkv, const T* dy, const float2* stats, u32 heads,
                                             u32 t, float scale) {
    constexpr int S = stages_that_fit(D, 2, STAGES);
    constexpr int KV = streamed_rows(D, 2, S);
    constexpr u32 P = D + 8;
    __shared__ __align__(16) u16 q_tile[ATTENTION_ROWS * P];
    __shared__ __align__(16) u16 dy_tile[ATTENTION_ROWS * P];
    __shared__ __align__(16) u16 k_tiles[S][KV * P];
    __shared__ __align__(16) u16 v_tiles[S][KV * P];
    __shared__ __align__(16) float2 row_stats[ATTENTION_ROWS];
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 q0 = (gridDim.x - 1 - blockIdx.x) * ATTENTION_ROWS;
    const u32 warp_row0 = q0 + warp * 16;
    const Head at = head_of<D>(blockIdx.y, heads, t);
    const u16* src = (const u16*)qkv;
    issue_tile<D>(q_tile, src + at.qkv[0], at.qkv_stride, q0, ATTENTION_ROWS, t);
    issue_tile<D>(dy_tile, (const u16*)dy + at.out, at.out_stride, q0, ATTENTION_ROWS, t);
    issue_stats(row_stats, stats, at.stats, q0, ATTENTION_ROWS, t);

    float dq[D / 8][4];
    zero_acc<D>(dq);
    auto issue = [&](u32 k0, int stage) {
        issue_tile<D>(k_tiles[stage], src + at.qkv[1], at.qkv_stride, k0, KV, t);
        issue_tile<D>(v_tiles[stage], src + at.qkv[2], at.qkv_stride, k0, KV, t);
    };
    auto use = [&](u32 k0, int stage) {
        if (k0 > warp_row0 + 15) return;
        float s[KV / 8][4], dp[KV / 8][4];
        weights_and_grads<T, D, KV>(s, dp, q_tile + warp * 16 * P, k_tiles[stage], dy_tile + warp * 16 * P,
                                    v_tiles[stage], row_stats + warp * 16, warp_row0, k0, t, false, scale * LOG2E,
                                    lane);
        warp_product_pb<T, D, KV>(dq, dp, k_tiles[stage], lane);
    };
    stream_tiles<S, KV>(0, min(q0 + ATTENTION_ROWS, t), issue, use);
    const float factor[2] = {scale, scale};
    store_rows<T, D>((u16*)dqkv + at.qkv[0], at.qkv_stride, dq, factor, warp_row0, t, lane);
}

// dK and dV for one key block: the weights recomputed (transposed) for every query block from
// the diagonal on.
template <typename T, int D, int STAGES>
__device__ __forceinline__ void attention_dkdv(T* dqkv, const T* qkv, const T* dy, const float2* stats, u32 heads,
                                               u32 t, float scale) {
    constexpr int S = stages_that_fit(D, 2, STAGES);
    constexpr int QR = streamed_rows(D, 2, S);
    constexpr u32 P = D + 8;
    __shared__ __align__(16) u16 k_tile[ATTENTION_ROWS * P];
    __shared__ __align__(16) u16 v_tile[ATTENTION_ROWS * P];
    __shared__ __align__(16) u16 q_tiles[S][QR * P];
    __shared__ __align__(16) u16 dy_tiles[S][QR * P];
    __shared__ __align__(16) float2 col_stats[S][QR];
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Earliest key blocks first: they see the most queries.
    const u32 k0 = blockIdx.x * ATTENTION_ROWS;
    const u32 warp_key0 = k0 + warp * 16;
    const Head at = head_of<D>(blockIdx.y, heads, t);
    const u16* src = (const u16*)qkv;
    issue_tile<D>(k_tile, src + at.qkv[1], at.qkv_stride, k0, ATTENTION_ROWS, t);
    issue_tile<D>(v_tile, src + at.qkv[2], at.qkv_stride, k0, ATTENTION_ROWS, t);

    float dk[D / 8][4], dv[D / 8][4];
    zero_acc<D>(dk);
    zero_acc<D>(dv);
    auto issue = [&](u32 q0, int stage) {
        issue_tile<D>(q_tiles[stage], src + at.qkv[0], at.qkv_stride, q0, QR, t);
        issue_tile<D>(dy_tiles[stage], (const u16*)dy + at.out, at.out_stride, q0, QR, t);
        issue_stats(col_stats[stage], stats, at.stats, q0, QR, t);
    };
    auto use = [&](u32 q0, int stage) {
        if (q0 + QR - 1 < warp_key0) return;  // every query of the tile is before this warp's keys
        float s[QR / 8][4], dp[QR / 8][4];
        weights_and_grads<T, D, QR>(s, dp, k_tile + warp * 16 * P, q_tiles[stage], v_tile + warp * 16 * P,
                                    dy_tiles[stage], col_stats[stage], warp_key0, q0, t, true, scale * LOG2E, lane);
        warp_product_pb<T, D, QR>(dv, s, dy_tiles[stage], lane);
        warp_product_pb<T, D, QR>(dk, dp, q_tiles[stage], lane);
    };
    stream_tiles<S, QR>(k0, t, issue, use);
    const float k_factor[2] = {scale, scale}, v_factor[2] = {1.0f, 1.0f};
    store_rows<T, D>((u16*)dqkv + at.qkv[1], at.qkv_stride, dk, k_factor, warp_key0, t, lane);
    store_rows<T, D>((u16*)dqkv + at.qkv[2], at.qkv_stride, dv, v_factor, warp_key0, t, lane);
}

// ---- entry points: <kernel>[_pipelined]_<dtype>_d<head_dim>, causal_attention_row_stats_<dtype>

// Blocks an SM the dK/dV kernel asks room for: 3 (at most 168 registers a thread) in two stages,
// whose half-height tiles leave room for its two accumulators; 2 in one (168 would spill).
__host__ __device__ constexpr int dkdv_blocks_per_sm(int d, int stages) {
    return stages_that_fit(d, 2, stages) == 2 ? 3 : 2;
}

// One head dim's three kernels, named forward_<dtype>_d<D>, dq_… and dkdv_…, in STAGES stages.
// At least 3 blocks an SM for the forward and dQ kernels (at most 168 registers a thread, which
// they reach without spilling).
#define ATTENTION_KERNELS(T, suffix, D, STAGES, forward, dq, dkdv)                               \
    extern "C" __global__ void __launch_bounds__(ATTENTION_WARPS * 32, 3)                            \
        forward##_##suffix##_d##D(T* y, float* lse, const T* qkv, u32 heads, u32 t, float scale) { \
        attention_forward<T, D, STAGES>(y, lse, qkv, heads, t, scale);                            \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTENTION_WARPS * 32, 3)                            \
        dq##_##suffix##_d##D(T* dqkv, const T* qkv, const T* dy, const float2* stats, u32 heads, u32 t, \
                             float scale) {                                                       \
        attention_dq<T, D, STAGES>(dqkv, qkv, dy, stats, heads, t, scale);                        \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTENTION_WARPS * 32, dkdv_blocks_per_sm(D, STAGES))   \
        dkdv##_##suffix##_d##D(T* dqkv, const T* qkv, const T* dy, const float2* stats, u32 heads, u32 t, \
                               float scale) {                                                     \
        attention_dkdv<T, D, STAGES>(dqkv, qkv, dy, stats, heads, t, scale);                      \
    }
#define ATTENTION_HEAD(T, suffix, D)                                                              \
    ATTENTION_KERNELS(T, suffix, D, 1, causal_attention, causal_attention_dq, causal_attention_dkdv) \
    ATTENTION_KERNELS(T, suffix, D, 2, causal_attention_pipelined, causal_attention_dq_pipelined,  \
                      causal_attention_dkdv_pipelined)

// The head dims the backend may launch (backend-cuda's entry_points.rs ATTENTION_HEAD_DIMS lists the same).
#define ATTENTION_HEADS(T, suffix)                                                                \
    ATTENTION_HEAD(T, suffix, 32) ATTENTION_HEAD(T, suffix, 64) ATTENTION_HEAD(T, suffix, 128)   \
    extern "C" __global__ void causal_attention_row_stats_##suffix(float2* stats, const float* lse, const T* y, \
                                                                   const T* dy, u32 rows, u32 heads, u32 t, u32 d) { \
        attention_row_stats<T>(stats, lse, y, dy, rows, heads, t, d);                             \
    }

ATTENTION_HEADS(bf16, bf16)
ATTENTION_HEADS(f16, f16)
