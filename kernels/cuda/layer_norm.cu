// layer_norm_last over the last axis of a contiguous [rows, cols] and its gradient: a group of G
// threads per row (as softmax.cu) combines the row's sums in shared memory. f32 math; the
// backward pass recomputes the statistics instead of storing them.

// The row's mean (x) and 1 / sqrt(var + eps) (y), biased variance, two passes.
template <typename T>
__device__ __forceinline__ float2 row_statistics(float* scratch, const T* src, u32 base, u32 cols, u32 lane,
                                                 u32 group, float eps) {
    float local = 0.0f;
    for (u32 c = lane; c < cols; c += group) local += to_f32(src[base + c]);
    float mean = combine(scratch, lane, group, local, false) / cols;
    float squares = 0.0f;
    for (u32 c = lane; c < cols; c += group) {
        float d = to_f32(src[base + c]) - mean;
        squares += d * d;
    }
    return make_float2(mean, rsqrtf(combine(scratch, lane, group, squares, false) / cols + eps));
}

#define LAYER_NORM(T, suffix)                                                                     \
    extern "C" __global__ void layer_norm_##suffix(T* out, const T* src, u32 rows, u32 cols,      \
                                                   float eps, u32 group) {                        \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                        \
        u32 base = (row < rows ? row : rows - 1) * cols;                                          \
        float2 s = row_statistics(scratch, src, base, cols, lane, group, eps);                    \
        if (row >= rows) return;                                                                  \
        for (u32 c = lane; c < cols; c += group)                                                  \
            out[base + c] = from_f32<T>((to_f32(src[base + c]) - s.x) * s.y);                     \
    }                                                                                             \
    extern "C" __global__ void layer_norm_backward_##suffix(T* out, const T* grad, const T* src,  \
                                                            u32 rows, u32 cols, float eps,        \
                                                            u32 group) {                          \
        __shared__ float scratch[256];                                                            \
        u32 lane = threadIdx.x % group;                                                           \
        u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                        \
        u32 base = (row < rows ? row : rows - 1) * cols;                                          \
        float2 s = row_statistics(scratch, src, base, cols, lane, group, eps);                    \
        float local_g = 0.0f, local_gn = 0.0f;                                                    \
        for (u32 c = lane; c < cols; c += group) {                                                \
            float g = to_f32(grad[base + c]);                                                     \
            local_g += g;                                                                         \
            local_gn += g * (to_f32(src[base + c]) - s.x) * s.y;                                  \
        }                                                                                         \
        float g_mean = combine(scratch, lane, group, local_g, false) / cols;                     \
        float gn_mean = combine(scratch, lane, group, local_gn, false) / cols;                   \
        if (row >= rows) return;                                                                  \
        for (u32 c = lane; c < cols; c += group) {                                                \
            float normed = (to_f32(src[base + c]) - s.x) * s.y;                                   \
            out[base + c] = from_f32<T>(s.y * (to_f32(grad[base + c]) - g_mean - normed * gn_mean)); \
        }                                                                                         \
    }
FOR_FLOATS(LAYER_NORM)
