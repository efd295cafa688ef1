// cross_entropy: the mean cross-entropy's row losses and gradient in one pass per row of
// contiguous [rows, classes] logits against u32 targets, f32 math for every T. A group of G
// threads per row (G = 32 for short rows, 256 for long; 256 / G rows per block): each thread
// keeps a running maximum m and sum s of exp(x - m) over its strided classes (one read of the
// row), the group merges them in a fixed tree order (no atomics: the same bits every run), then
// a second read writes dlogits = (exp(x - lse) - onehot) * inv_rows. A row whose maximum is not
// finite has a NaN loss and gradient; a target out of range gives loss 0 and gradient 0, as
// the composed gather and scatter_add do here.

// The running maximum starts at the lowest finite float, not -inf: a -inf logit then adds
// exp(-inf) = 0 instead of exp(-inf + inf) = NaN. A row of only -inf keeps s = 0.
#define LOWEST_F32 (-3.402823466e38f)

__device__ __forceinline__ void add_logit(float& m, float& s, float x) {
    // A NaN fails the comparison and makes s NaN.
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

__device__ __forceinline__ void merge_logits(float& m, float& s, float m2, float s2) {
    float hi = m2 > m ? m2 : m;
    s = s * expf(m - hi) + s2 * expf(m2 - hi);
    m = hi;
}

// The group's (m, s) pairs merged, returned to every member through m and s.
__device__ __forceinline__ void combine_logits(float* maxes, float* sums, u32 lane, u32 group, float& m, float& s) {
    maxes[threadIdx.x] = m;
    sums[threadIdx.x] = s;
    __syncthreads();
    for (u32 width = group / 2; width > 0; width /= 2) {
        if (lane < width) {
            float mine = maxes[threadIdx.x], total = sums[threadIdx.x];
            merge_logits(mine, total, maxes[threadIdx.x + width], sums[threadIdx.x + width]);
            maxes[threadIdx.x] = mine;
            sums[threadIdx.x] = total;
        }
        __syncthreads();
    }
    m = maxes[threadIdx.x - lane];
    s = sums[threadIdx.x - lane];
}

// dlogits is written only when write_grad is 1 (the host passes the logits' pointer otherwise).
#define CROSS_ENTROPY(T, suffix)                                                                  \
    extern "C" __global__ void cross_entropy_##suffix(float* losses, T* dlogits, const T* logits, \
                                                      const u32* targets, u32 rows, u32 classes,  \
                                                      float inv_rows, u32 write_grad, u32 group) { \
        __shared__ float maxes[256];                                                              \
        __shared__ float sums[256];                                                               \
        u32 lane = threadIdx.x % group;                                                           \
        u32 row = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                        \
        u32 base = (row < rows ? row : rows - 1) * classes;                                       \
        float m = LOWEST_F32, s = 0.0f;                                                           \
        for (u32 c = lane; c < classes; c += group) add_logit(m, s, to_f32(logits[base + c]));   \
        combine_logits(maxes, sums, lane, group, m, s);                                           \
        if (row >= rows) return;                                                                  \
        u32 target = targets[row];                                                                \
        bool valid = target < classes;                                                            \
        bool poisoned = !is_finite(m) || is_nan(s) || s == 0.0f;                                  \
        float lse = m + logf(s);                                                                  \
        if (lane == 0)                                                                            \
            losses[row] = !valid ? 0.0f : poisoned ? F32_NAN : lse - to_f32(logits[base + target]); \
        if (!write_grad) return;                                                                  \
        for (u32 c = lane; c < classes; c += group) {                                             \
            float p = expf(to_f32(logits[base + c]) - lse) - (c == target ? 1.0f : 0.0f);          \
            float d = poisoned ? F32_NAN : valid ? p * inv_rows : 0.0f;                           \
            dlogits[base + c] = from_f32<T>(d);                                                   \
        }                                                                                         \
    }
FOR_FLOATS(CROSS_ENTROPY)

// The backward pass: the saved dlogits times the loss' gradient, read here on the device.
#define CROSS_ENTROPY_BACKWARD(T, suffix)                                                         \
    extern "C" __global__ void cross_entropy_backward_##suffix(T* out, const T* dlogits,          \
                                                               const float* grad, u32 n) {        \
        float g = grad[0];                                                                        \
        FOR_EACH(i, n) out[i] = from_f32<T>(to_f32(dlogits[i]) * g);                              \
    }
FOR_FLOATS(CROSS_ENTROPY_BACKWARD)
