// layer_norm_last over the last axis of a contiguous [rows, cols] with its optional affine part
// (also with the residual add that produces its input: add_layer_norm), and its gradients: a
// group of G threads per row (as softmax.cu) combines the row's sums in shared memory. f32
// math; the backward pass recomputes the statistics instead of storing them.
// The weight's and bias's gradients are column sums over the rows in an order fixed by the shape:
// each group sums its chunk of rows into `parts` in row order (each column of a chunk written by
// the one thread that owns it, no atomics), then layer_norm_column_sums adds the chunks in order.
// flags: LN_WEIGHT a weight, LN_BIAS a bias (an absent one's pointer is never read), LN_SUMS the
// backward pass sums the columns into parts, [2, chunks, cols]: grad * normed, then grad.

#define LN_WEIGHT 1u
#define LN_BIAS 2u
#define LN_SUMS 4u
// Backward: the input's gradient adds `accumulated` (its other uses' gradient, in the input's
// dtype) to the LayerNorm's share, rounded once as a separate add would; LN_ROUNDED also writes
// that sum in the output gradient's half type (`rounded`: the gradient of the 16-bit branch that
// the residual add producing the input widened).
#define LN_ACCUMULATE 8u
#define LN_ROUNDED 16u

// The row's mean (x) and 1 / sqrt(var + eps) (y), biased variance, two passes over `value(c)`.
template <typename Load>
__device__ __forceinline__ float2 row_statistics(float* scratch, Load value, u32 cols, u32 lane, u32 group,
                                                 float eps) {
    float local = 0.0f;
    for (u32 c = lane; c < cols; c += group) local += value(c);
    float mean = combine(scratch, lane, group, local, false) / cols;
    float squares = 0.0f;
    for (u32 c = lane; c < cols; c += group) {
        float d = value(c) - mean;
        squares += d * d;
    }
    return make_float2(mean, rsqrtf(combine(scratch, lane, group, squares, false) / cols + eps));
}

// The weight of column c, 1 without one.
template <typename T>
__device__ __forceinline__ float ln_scale(const T* weight, u32 flags, u32 c) {
    return (flags & LN_WEIGHT) ? to_f32(weight[c]) : 1.0f;
}

// Column c's value x normalised by its row's statistics s, scaled and shifted.
template <typename T>
__device__ __forceinline__ float ln_affine(float x, float2 s, const T* weight, const T* bias, u32 flags, u32 c) {
    float y = (x - s.x) * s.y * ln_scale(weight, flags, c);
    return (flags & LN_BIAS) ? y + to_f32(bias[c]) : y;
}

// The row a group of `group` threads normalises forward (past the last row: the last row's
// place, its statistics taken for their barriers and nothing written) and the thread's lane.
struct LnRow {
    u32 row, base, lane;
};
__device__ __forceinline__ LnRow ln_row(u32 rows, u32 cols, u32 group) {
    u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;
    return LnRow{row, (row < rows ? row : rows - 1) * cols, threadIdx.x % group};
}

// A group per row; the output in TO (T, or a half type for an f32 input whose result feeds a
// half-precision product: the same f32 value, rounded once, as layer_norm_f32 then a cast).
template <typename T, typename TO>
__device__ __forceinline__ void layer_norm_rows(TO* out, const T* src, const T* weight, const T* bias, u32 rows,
                                                u32 cols, float eps, u32 group, u32 flags) {
    __shared__ float scratch[256];
    LnRow r = ln_row(rows, cols, group);
    auto value = [&](u32 c) { return to_f32(src[r.base + c]); };
    float2 s = row_statistics(scratch, value, cols, r.lane, group, eps);
    if (r.row >= rows) return;
    for (u32 c = r.lane; c < cols; c += group) {
        out[r.base + c] = from_f32<TO>(ln_affine(value(c), s, weight, bias, flags, c));
    }
}

// `residual + branch` (the branch widened exactly, the sum rounded to T as the binary add
// stores it) written to `sum`, and its LayerNorm to `out`, a group per row: the statistics are
// taken from the sums as they would be read back, and the sum is written once, never read.
template <typename T, typename TB, typename TO>
__device__ __forceinline__ void add_layer_norm_rows(T* sum, TO* out, const T* residual, const TB* branch,
                                                    const T* weight, const T* bias, u32 rows, u32 cols, float eps,
                                                    u32 group, u32 flags) {
    __shared__ float scratch[256];
    LnRow r = ln_row(rows, cols, group);
    auto value = [&](u32 c) { return stored<T>(to_f32(residual[r.base + c]) + to_f32(branch[r.base + c])); };
    float2 s = row_statistics(scratch, value, cols, r.lane, group, eps);
    if (r.row >= rows) return;
    for (u32 c = r.lane; c < cols; c += group) {
        float x = value(c);
        sum[r.base + c] = from_f32<T>(x);
        out[r.base + c] = from_f32<TO>(ln_affine(x, s, weight, bias, flags, c));
    }
}

// A group per chunk of chunk_rows rows, in order: every thread runs every row's combines (their
// barriers), a row past the end writing nothing. The output gradient in TG (T, or the half type
// layer_norm_rows wrote; widened exactly as a cast would); `accumulated` and `rounded` as the
// flags say (LN_ROUNDED only where TG is a half type beside an f32 T).
template <typename T, typename TG>
__device__ __forceinline__ void layer_norm_backward_rows(T* out, TG* rounded, float* parts, const TG* grad,
                                                         const T* src, const T* weight, const T* accumulated,
                                                         u32 rows, u32 cols, float eps, u32 group, u32 flags,
                                                         u32 chunk_rows, u32 chunks) {
    __shared__ float scratch[256];
    u32 lane = threadIdx.x % group;
    u32 chunk = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;
    for (u32 i = 0; i < chunk_rows; ++i) {
        u32 row = chunk * chunk_rows + i;
        u32 base = (row < rows ? row : rows - 1) * cols;
        auto value = [&](u32 c) { return to_f32(src[base + c]); };
        float2 s = row_statistics(scratch, value, cols, lane, group, eps);
        float local_gw = 0.0f, local_gwn = 0.0f;
        for (u32 c = lane; c < cols; c += group) {
            float gw = to_f32(grad[base + c]) * ln_scale(weight, flags, c);
            local_gw += gw;
            local_gwn += gw * (value(c) - s.x) * s.y;
        }
        float gw_mean = combine(scratch, lane, group, local_gw, false) / cols;
        float gwn_mean = combine(scratch, lane, group, local_gwn, false) / cols;
        if (row >= rows) continue;
        for (u32 c = lane; c < cols; c += group) {
            float g = to_f32(grad[base + c]);
            float normed = (value(c) - s.x) * s.y;
            float gw = g * ln_scale(weight, flags, c);
            float dx = stored<T>(s.y * (gw - gw_mean - normed * gwn_mean));
            if (flags & LN_ACCUMULATE) dx = stored<T>(to_f32(accumulated[base + c]) + dx);
            out[base + c] = from_f32<T>(dx);
            if (flags & LN_ROUNDED) rounded[base + c] = from_f32<TG>(dx);
            if (flags & LN_SUMS) {
                // The chunk's first row starts its sums.
                u32 at = chunk * cols + c, at_bias = (chunks + chunk) * cols + c;
                parts[at] = (i ? parts[at] : 0.0f) + g * normed;
                parts[at_bias] = (i ? parts[at_bias] : 0.0f) + g;
            }
        }
    }
}

#define LAYER_NORM(T, suffix)                                                                     \
    extern "C" __global__ void layer_norm_##suffix(T* out, const T* src, const T* weight,         \
                                                   const T* bias, u32 rows, u32 cols, float eps,  \
                                                   u32 group, u32 flags) {                        \
        layer_norm_rows<T, T>(out, src, weight, bias, rows, cols, eps, group, flags);             \
    }                                                                                             \
    extern "C" __global__ void add_layer_norm_##suffix(T* sum, T* out, const T* residual,         \
                                                       const T* branch, const T* weight,          \
                                                       const T* bias, u32 rows, u32 cols,         \
                                                       float eps, u32 group, u32 flags) {         \
        add_layer_norm_rows<T, T, T>(sum, out, residual, branch, weight, bias, rows, cols, eps,   \
                                     group, flags);                                               \
    }                                                                                             \
    extern "C" __global__ void layer_norm_backward_##suffix(                                      \
        T* out, T* rounded, float* parts, const T* grad, const T* src, const T* weight,           \
        const T* accumulated, u32 rows, u32 cols, float eps, u32 group, u32 flags,                \
        u32 chunk_rows, u32 chunks) {                                                             \
        layer_norm_backward_rows<T, T>(out, rounded, parts, grad, src, weight, accumulated, rows, \
                                       cols, eps, group, flags, chunk_rows, chunks);              \
    }                                                                                             \
    /* A thread per column: the weight's and bias's gradients, the chunks added in order. */      \
    extern "C" __global__ void layer_norm_column_sums_##suffix(T* dweight, T* dbias,              \
                                                               const float* parts, u32 cols,      \
                                                               u32 chunks) {                      \
        u32 c = blockIdx.x * blockDim.x + threadIdx.x;                                            \
        if (c >= cols) return;                                                                    \
        float dw = 0.0f, db = 0.0f;                                                               \
        for (u32 k = 0; k < chunks; ++k) {                                                        \
            dw += parts[k * cols + c];                                                            \
            db += parts[(chunks + k) * cols + c];                                                 \
        }                                                                                         \
        dweight[c] = from_f32<T>(dw);                                                             \
        dbias[c] = from_f32<T>(db);                                                               \
    }
FOR_FLOATS(LAYER_NORM)

// An f32 LayerNorm whose output feeds a half-precision product (Backend::layer_norm_last_to),
// the residual add before it with a half branch (add_layer_norm_last_to), and the gradient
// arriving in that half type: layer_norm_f32_to_<half>, add_layer_norm_f32_<half>,
// layer_norm_backward_f32_from_<half>.
#define LAYER_NORM_TO_HALF(H, suffix)                                                             \
    extern "C" __global__ void layer_norm_f32_to_##suffix(H* out, const float* src, const float* weight, \
                                                          const float* bias, u32 rows, u32 cols,  \
                                                          float eps, u32 group, u32 flags) {      \
        layer_norm_rows<float, H>(out, src, weight, bias, rows, cols, eps, group, flags);         \
    }                                                                                             \
    extern "C" __global__ void add_layer_norm_f32_##suffix(                                       \
        float* sum, H* out, const float* residual, const H* branch, const float* weight,          \
        const float* bias, u32 rows, u32 cols, float eps, u32 group, u32 flags) {                 \
        add_layer_norm_rows<float, H, H>(sum, out, residual, branch, weight, bias, rows, cols,    \
                                         eps, group, flags);                                      \
    }                                                                                             \
    extern "C" __global__ void layer_norm_backward_f32_from_##suffix(                             \
        float* out, H* rounded, float* parts, const H* grad, const float* src,                    \
        const float* weight, const float* accumulated, u32 rows, u32 cols, float eps, u32 group,  \
        u32 flags, u32 chunk_rows, u32 chunks) {                                                  \
        layer_norm_backward_rows<float, H>(out, rounded, parts, grad, src, weight, accumulated,   \
                                           rows, cols, eps, group, flags, chunk_rows, chunks);    \
    }
LAYER_NORM_TO_HALF(f16, f16) LAYER_NORM_TO_HALF(bf16, bf16)
