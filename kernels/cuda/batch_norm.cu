// batch_norm: training-mode batch normalisation of a contiguous [outer, channels, inner] with
// the batch's own statistics, and its gradient, in three kernels each way. The input, output and
// their gradients are f32, f16 or bf16 (autocast's batch norm keeps its input's dtype, as
// PyTorch's does); weight, bias, statistics and every sum are f32. A channel's
// `outer * inner` values are cut into chunks whose length the host picks from the shape alone;
// one block reduces one (chunk, channel) in a fixed order, then one thread per channel folds its
// chunks in order, so every run gives the same bits. Statistics are Welford's per thread and
// Chan's rule to merge (no cancellation from sums of squares); the element ops are the CPU's, in
// its order.

// Where value r (of outer * inner) of channel c sits.
__device__ __forceinline__ u32 channel_offset(u32 r, u32 c, u32 channels, u32 inner) {
    return (r / inner) * channels * inner + c * inner + r % inner;
}

// The count, mean and sum of squared deviations of some values.
struct Moments {
    float n, mean, m2;
};

__device__ __forceinline__ Moments merge(Moments a, Moments b) {
    float n = a.n + b.n;
    if (b.n == 0.0f) return a;
    float d = b.mean - a.mean, share = b.n / n;
    Moments r;
    r.n = n;
    r.mean = a.mean + d * share;
    r.m2 = a.m2 + b.m2 + d * d * a.n * share;
    return r;
}

// The values of chunk `blockIdx.x` of channel `blockIdx.y`.
__device__ __forceinline__ u32 chunk_start(u32 chunk_len) { return blockIdx.x * chunk_len; }
__device__ __forceinline__ u32 chunk_end(u32 chunk_len, u32 count) { return min((blockIdx.x + 1) * chunk_len, count); }

// Pass 1 forward: the mean and m2 of each (chunk, channel), at part[channel * chunks + chunk].
template <typename T>
__device__ void moments(float* part_mean, float* part_m2, const T* x, u32 channels, u32 inner, u32 count,
                        u32 chunk_len) {
    __shared__ float n[256], mean[256], m2[256];
    u32 c = blockIdx.y, t = threadIdx.x;
    Moments a = {0.0f, 0.0f, 0.0f};
    for (u32 r = chunk_start(chunk_len) + t; r < chunk_end(chunk_len, count); r += blockDim.x) {
        float v = to_f32(x[channel_offset(r, c, channels, inner)]);
        a.n += 1.0f;
        float d = v - a.mean;
        a.mean += d / a.n;
        a.m2 += d * (v - a.mean);
    }
    n[t] = a.n;
    mean[t] = a.mean;
    m2[t] = a.m2;
    __syncthreads();
    for (u32 width = blockDim.x / 2; width > 0; width /= 2) {
        if (t < width) {
            Moments l = {n[t], mean[t], m2[t]}, r = {n[t + width], mean[t + width], m2[t + width]};
            Moments m = merge(l, r);
            n[t] = m.n;
            mean[t] = m.mean;
            m2[t] = m.m2;
        }
        __syncthreads();
    }
    if (t == 0) {
        part_mean[c * gridDim.x + blockIdx.x] = mean[0];
        part_m2[c * gridDim.x + blockIdx.x] = m2[0];
    }
}
#define MOMENTS(T, suffix)                                                                        \
    extern "C" __global__ void batch_norm_moments_##suffix(float* part_mean, float* part_m2, const T* x, \
                                                           u32 channels, u32 inner, u32 count,           \
                                                           u32 chunk_len) {                              \
        moments(part_mean, part_m2, x, channels, inner, count, chunk_len);                             \
    }
FOR_FLOATS(MOMENTS)

// Pass 2 forward: each channel's mean and biased variance from its chunks, in chunk order.
extern "C" __global__ void batch_norm_statistics_f32(float* mean, float* var, const float* part_mean,
                                                     const float* part_m2, u32 channels, u32 count,
                                                     u32 chunk_len, u32 chunks) {
    u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    Moments a = {0.0f, 0.0f, 0.0f};
    for (u32 k = 0; k < chunks; ++k) {
        Moments b = {(float)min(chunk_len, count - k * chunk_len), part_mean[c * chunks + k], part_m2[c * chunks + k]};
        a = merge(a, b);
    }
    mean[c] = a.mean;
    var[c] = a.m2 / (float)count;
}

// Pass 3 forward: y = (x - mean) / sqrt(var + eps) * weight + bias.
#define NORMALIZE(T, suffix)                                                                      \
    extern "C" __global__ void batch_norm_normalize_##suffix(T* y, const T* x, const float* mean,        \
                                                             const float* var, const float* weight,      \
                                                             const float* bias, u32 len, u32 channels,   \
                                                             u32 inner, float eps) {                     \
        FOR_EACH(i, len) {                                                                              \
            u32 c = (i / inner) % channels;                                                             \
            y[i] = from_f32<T>((to_f32(x[i]) - mean[c]) / sqrtf(var[c] + eps) * weight[c] + bias[c]);   \
        }                                                                                               \
    }
FOR_FLOATS(NORMALIZE)

// Pass 1 backward: Σ g and Σ g·x̂ of each (chunk, channel), x̂ = (x - mean) / sqrt(var + eps).
template <typename T>
__device__ void grad_sums(float* part_g, float* part_gx, const T* g, const T* x, const float* mean,
                          const float* var, u32 channels, u32 inner, u32 count, u32 chunk_len, float eps) {
    __shared__ float scratch[256];
    u32 c = blockIdx.y, t = threadIdx.x;
    float m = mean[c], denom = sqrtf(var[c] + eps), a = 0.0f, b = 0.0f;
    for (u32 r = chunk_start(chunk_len) + t; r < chunk_end(chunk_len, count); r += blockDim.x) {
        u32 o = channel_offset(r, c, channels, inner);
        float gv = to_f32(g[o]);
        a += gv;
        b += gv * ((to_f32(x[o]) - m) / denom);
    }
    // The whole block is one group (the prelude's combine; a fixed order of additions).
    float sum_g = combine(scratch, t, blockDim.x, a, false);
    float sum_gx = combine(scratch, t, blockDim.x, b, false);
    if (t == 0) {
        part_g[c * gridDim.x + blockIdx.x] = sum_g;
        part_gx[c * gridDim.x + blockIdx.x] = sum_gx;
    }
}
#define GRAD_SUMS(T, suffix)                                                                      \
    extern "C" __global__ void batch_norm_grad_sums_##suffix(float* part_g, float* part_gx, const T* g,  \
                                                             const T* x, const float* mean,              \
                                                             const float* var, u32 channels, u32 inner,  \
                                                             u32 count, u32 chunk_len, float eps) {      \
        grad_sums(part_g, part_gx, g, x, mean, var, channels, inner, count, chunk_len, eps);           \
    }
FOR_FLOATS(GRAD_SUMS)

// Pass 2 backward: dbias = Σ g and dweight = Σ g·x̂ per channel, in chunk order.
extern "C" __global__ void batch_norm_grad_totals_f32(float* dweight, float* dbias, const float* part_g,
                                                      const float* part_gx, u32 channels, u32 chunks) {
    u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    float a = 0.0f, b = 0.0f;
    for (u32 k = 0; k < chunks; ++k) {
        a += part_g[c * chunks + k];
        b += part_gx[c * chunks + k];
    }
    dbias[c] = a;
    dweight[c] = b;
}

// Pass 3 backward: dx = weight / denom · (g - dbias / n - x̂ · dweight / n).
#define INPUT_GRAD(T, suffix)                                                                     \
    extern "C" __global__ void batch_norm_input_grad_##suffix(                                         \
        T* dx, const T* g, const T* x, const float* mean, const float* var, const float* weight,        \
        const float* dweight, const float* dbias, u32 len, u32 channels, u32 inner, float count,       \
        float eps) {                                                                                    \
        FOR_EACH(i, len) {                                                                              \
            u32 c = (i / inner) % channels;                                                             \
            float denom = sqrtf(var[c] + eps);                                                          \
            float x_hat = (to_f32(x[i]) - mean[c]) / denom;                                             \
            dx[i] = from_f32<T>(weight[c] / denom *                                                     \
                                (to_f32(g[i]) - dbias[c] / count - x_hat * (dweight[c] / count)));      \
        }                                                                                               \
    }
FOR_FLOATS(INPUT_GRAD)

// A training batch's bookkeeping in one launch: each channel's running statistics become
// running * keep + batch * take (the variance made unbiased first), rounded op by op as the
// composed element ops are (no fused multiply-add), and the I64 count, when given, gains 1.
extern "C" __global__ void batch_norm_running_f32(float* running_mean, float* running_var, long long* batches,
                                                  const float* mean, const float* var, u32 channels, float keep,
                                                  float take, float unbias) {
    u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < channels) {
        running_mean[c] = __fadd_rn(__fmul_rn(running_mean[c], keep), __fmul_rn(mean[c], take));
        running_var[c] = __fadd_rn(__fmul_rn(running_var[c], keep), __fmul_rn(__fmul_rn(var[c], unbias), take));
    }
    if (c == 0 && batches != nullptr) *batches += 1;
}
