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
