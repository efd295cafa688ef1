// softmax_last / log_softmax_last over the last axis of a contiguous [rows, cols]: a group of G
// threads per row (G = 32 for short rows, 256 for long; 256 / G rows per block) combines the
// row's maximum and sum of exponentials in shared memory. f32 math.

#define SOFTMAX(T, suffix)                                                                        \
    extern "C" __global__ void softmax_##suffix(T* out, const T* src, u32 rows, u32 cols,         \
                                                u32 log_form, u32 group) {                        \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                        \
        u32 base = (row < rows ? row : rows - 1) * cols;                                          \
        float local_max = -F32_INF;                                                               \
        for (u32 c = lane; c < cols; c += group) local_max = max_nan(local_max, to_f32(src[base + c])); \
        float row_max = combine(scratch, lane, group, local_max, true);                          \
        float local_sum = 0.0f;                                                                   \
        for (u32 c = lane; c < cols; c += group) local_sum += expf(to_f32(src[base + c]) - row_max); \
        float sum = combine(scratch, lane, group, local_sum, false);                             \
        if (row >= rows) return;                                                                  \
        float log_sum = logf(sum);                                                                \
        /* A row whose maximum is not finite is NaN throughout, as on the CPU. */               \
        bool poisoned = !is_finite(row_max);                                                      \
        for (u32 c = lane; c < cols; c += group) {                                                \
            float shifted = to_f32(src[base + c]) - row_max;                                      \
            float value = log_form ? shifted - log_sum : expf(shifted) / sum;                     \
            out[base + c] = from_f32<T>(poisoned ? F32_NAN : value);                              \
        }                                                                                         \
    }
FOR_FLOATS(SOFTMAX)

// The softmax's gradient from its output y: dx = y * (grad - sum(grad * y)) per row.
#define SOFTMAX_BACKWARD(T, suffix)                                                               \
    extern "C" __global__ void softmax_backward_##suffix(T* out, const T* grad, const T* y,       \
                                                         u32 rows, u32 cols, u32 group) {         \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                        \
        u32 base = (row < rows ? row : rows - 1) * cols;                                          \
        float local_dot = 0.0f;                                                                   \
        for (u32 c = lane; c < cols; c += group) local_dot += to_f32(grad[base + c]) * to_f32(y[base + c]); \
        float dot = combine(scratch, lane, group, local_dot, false);                             \
        if (row >= rows) return;                                                                  \
        for (u32 c = lane; c < cols; c += group)                                                  \
            out[base + c] = from_f32<T>(to_f32(y[base + c]) * (to_f32(grad[base + c]) - dot));   \
    }
FOR_FLOATS(SOFTMAX_BACKWARD)

// causal_softmax (attention's weights): dropout(softmax(src * scale)) over rows of t scores, row
// r seeing keys 0 ..= r % t and 0 beyond; its backward from the scores and the output gradient,
// the weights computed again and the mask drawn again. Groups of threads per row as softmax.
// What dropout leaves of flat element e: keep where the stream's uniform is at least p, else 0.
__device__ __forceinline__ float causal_dropout(u32 e, u32 dropout, u64 seed, u64 counter, float p, float keep) {
    if (!dropout) return 1.0f;
    u32 w[4];
    philox(seed, counter + e / 4, w);
    return (float)unit_float(w[e % 4]) >= p ? keep : 0.0f;
}

// A group's row: its index (past the last row for spare groups), the first element of the row it
// reads, the keys it sees, and the maximum and sum of exponentials of its scaled scores over them.
struct CausalRow {
    u32 row, base, seen;
    float max, sum;
};

template <typename T>
__device__ __forceinline__ CausalRow causal_row(float* scratch, const T* src, u32 rows, u32 t, float scale, u32 lane,
                                                u32 group) {
    CausalRow at;
    at.row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;
    u32 r = at.row < rows ? at.row : rows - 1;
    at.base = r * t;
    at.seen = r % t + 1;
    float local_max = -F32_INF;
    for (u32 c = lane; c < at.seen; c += group) local_max = max_nan(local_max, to_f32(src[at.base + c]) * scale);
    at.max = combine(scratch, lane, group, local_max, true);
    float local_sum = 0.0f;
    for (u32 c = lane; c < at.seen; c += group) local_sum += expf(to_f32(src[at.base + c]) * scale - at.max);
    at.sum = combine(scratch, lane, group, local_sum, false);
    return at;
}

#define CAUSAL_SOFTMAX(T, suffix)                                                                 \
    extern "C" __global__ void causal_softmax_##suffix(T* out, const T* src, u32 rows, u32 t,     \
                                                       float scale, u32 dropout, u64 seed,        \
                                                       u64 counter, float p, float keep, u32 group) { \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        CausalRow at = causal_row(scratch, src, rows, t, scale, lane, group);                     \
        if (at.row >= rows) return;                                                               \
        /* A row whose maximum is not finite is NaN throughout, as softmax_last makes it. */     \
        bool poisoned = !is_finite(at.max);                                                       \
        for (u32 c = lane; c < t; c += group) {                                                   \
            float w = 0.0f;                                                                       \
            if (c < at.seen)                                                                      \
                w = expf(to_f32(src[at.base + c]) * scale - at.max) / at.sum                      \
                    * causal_dropout(at.base + c, dropout, seed, counter, p, keep);               \
            out[at.base + c] = from_f32<T>(poisoned ? F32_NAN : w);                               \
        }                                                                                         \
    }
FOR_FLOATS(CAUSAL_SOFTMAX)

// scale * y * (dy - sum(y * dy)) on the keys seen, 0 beyond; dy the gradient through dropout.
#define CAUSAL_SOFTMAX_BACKWARD(T, suffix)                                                        \
    extern "C" __global__ void causal_softmax_backward_##suffix(                                  \
        T* out, const T* grad, const T* src, u32 rows, u32 t, float scale, u32 dropout, u64 seed, \
        u64 counter, float p, float keep, u32 group) {                                            \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        CausalRow at = causal_row(scratch, src, rows, t, scale, lane, group);                     \
        float local_dot = 0.0f;                                                                   \
        for (u32 c = lane; c < at.seen; c += group)                                               \
            local_dot += expf(to_f32(src[at.base + c]) * scale - at.max) / at.sum                 \
                         * to_f32(grad[at.base + c])                                              \
                         * causal_dropout(at.base + c, dropout, seed, counter, p, keep);          \
        float dot = combine(scratch, lane, group, local_dot, false);                             \
        if (at.row >= rows) return;                                                               \
        bool poisoned = !is_finite(at.max);                                                       \
        for (u32 c = lane; c < t; c += group) {                                                   \
            float d = 0.0f;                                                                       \
            if (c < at.seen) {                                                                    \
                float y = expf(to_f32(src[at.base + c]) * scale - at.max) / at.sum;               \
                float dy = to_f32(grad[at.base + c]) * causal_dropout(at.base + c, dropout, seed, counter, p, keep); \
                d = poisoned ? F32_NAN : y * (dy - dot) * scale;                                  \
            }                                                                                     \
            out[at.base + c] = from_f32<T>(d);                                                    \
        }                                                                                         \
    }
FOR_FLOATS(CAUSAL_SOFTMAX_BACKWARD)
