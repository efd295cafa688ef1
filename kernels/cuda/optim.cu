// In-place optimizer updates on contiguous parameters and state, PyTorch semantics, in f32; the
// host folds the step's constants (bias corrections, decay factors) in f64 as the CPU does.
//   axpy:      dst += alpha * src
//   sgd_step:  with a momentum buffer when `momentum_buf` is non-null
//   adam_step: exp_avg and exp_avg_sq as state
//   adam_steps, sgd_steps, sum_of_squares, non_finite_count, scaled_copies, cast_copies: many tensors in one
//   launch (below)

#define AXPY(T, suffix)                                                                           \
    extern "C" __global__ void axpy_##suffix(T* dst, const T* src, u32 n, float alpha) {          \
        FOR_EACH(i, n) { dst[i] = from_f32<T>(to_f32(dst[i]) + alpha * to_f32(src[i])); }         \
    }
FOR_FLOATS(AXPY)

// keep = momentum (0 on the first step), take = 1 - dampening (1 on the first step). One
// element's update, shared by sgd_step and sgd_steps so both round alike.
template <typename T>
__device__ __forceinline__ void sgd_update(T* param, const T* grad, T* momentum_buf, u32 i, float lr,
                                           float weight_decay, float keep, float take, float momentum,
                                           bool nesterov) {
    float p = to_f32(param[i]);
    float d = to_f32(grad[i]) + weight_decay * p;
    if (momentum_buf) {
        float b = keep * to_f32(momentum_buf[i]) + take * d;
        momentum_buf[i] = from_f32<T>(b);
        d = nesterov ? d + momentum * b : b;
    }
    param[i] = from_f32<T>(p - lr * d);
}

#define SGD_STEP(T, suffix)                                                                       \
    extern "C" __global__ void sgd_step_##suffix(T* param, const T* grad, T* momentum_buf, u32 n, \
                                                 float lr, float weight_decay, float keep,        \
                                                 float take, float momentum, u32 nesterov) {      \
        FOR_EACH(i, n) {                                                                          \
            sgd_update(param, grad, momentum_buf, i, lr, weight_decay, keep, take, momentum,      \
                       nesterov != 0);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(SGD_STEP)

// decay: 1 - lr * wd for AdamW (else 1); l2: wd for Adam (else 0). One element's update, shared
// by adam_step and adam_steps so both round alike.
struct AdamConsts {
    float decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias2_sqrt, eps;
};

template <typename T>
__device__ __forceinline__ void adam_update(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, u32 i,
                                            const AdamConsts& k) {
    float p = to_f32(param[i]) * k.decay;
    float g = to_f32(grad[i]) + k.l2 * p;
    float m = k.beta1 * to_f32(exp_avg[i]) + k.one_minus_beta1 * g;
    float v = k.beta2 * to_f32(exp_avg_sq[i]) + k.one_minus_beta2 * g * g;
    exp_avg[i] = from_f32<T>(m);
    exp_avg_sq[i] = from_f32<T>(v);
    param[i] = from_f32<T>(p - k.step_size * m / (sqrtf(v) / k.bias2_sqrt + k.eps));
}

#define ADAM_STEP(T, suffix)                                                                      \
    extern "C" __global__ void adam_step_##suffix(T* param, const T* grad, T* exp_avg,            \
                                                  T* exp_avg_sq, u32 n, float decay, float l2,    \
                                                  float beta1, float one_minus_beta1, float beta2, \
                                                  float one_minus_beta2, float step_size,         \
                                                  float bias2_sqrt, float eps) {                  \
        AdamConsts k = {decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size,     \
                        bias2_sqrt, eps};                                                         \
        FOR_EACH(i, n) { adam_update(param, grad, exp_avg, exp_avg_sq, i, k); }                   \
    }
FOR_FLOATS(ADAM_STEP)

// ---- multi-tensor launches (apex's multi_tensor_apply): one launch for many tensors. The host
// uploads a table of tensors (up to four pointers, a length and the tensor's constants) and a
// table of chunks; block b works on chunk b, `chunk_len` elements of one tensor from `start`.

struct TensorEntry {
    u64 ptr[4];
    u32 n;
    u32 pad;
    float k[10];
};

struct ChunkEntry {
    u32 tensor;
    u32 start;
};

// This block's chunk: its tensor and the element range [begin, end).
__device__ __forceinline__ const TensorEntry& chunk_of(const TensorEntry* tensors, const ChunkEntry* chunks,
                                                       u32 chunk_len, u32* begin, u32* end) {
    ChunkEntry c = chunks[blockIdx.x];
    const TensorEntry& e = tensors[c.tensor];
    *begin = c.start;
    *end = min(c.start + chunk_len, e.n);
    return e;
}

#define FOR_CHUNK(i, begin, end) for (u32 i = (begin) + threadIdx.x; i < (end); i += blockDim.x)

// ptr: param, grad, exp_avg, exp_avg_sq; k: the AdamConsts in their order.
#define ADAM_STEPS(T, suffix)                                                                     \
    extern "C" __global__ void adam_steps_##suffix(const TensorEntry* tensors, const ChunkEntry* chunks, \
                                                   u32 chunk_len) {                               \
        u32 begin, end;                                                                           \
        const TensorEntry& e = chunk_of(tensors, chunks, chunk_len, &begin, &end);                \
        AdamConsts k = {e.k[0], e.k[1], e.k[2], e.k[3], e.k[4], e.k[5], e.k[6], e.k[7], e.k[8]};  \
        FOR_CHUNK(i, begin, end) {                                                                \
            adam_update((T*)e.ptr[0], (const T*)e.ptr[1], (T*)e.ptr[2], (T*)e.ptr[3], i, k);      \
        }                                                                                         \
    }
FOR_FLOATS(ADAM_STEPS)

// ptr: param, grad, momentum buffer (0: none); k: lr, weight_decay, keep, take, momentum,
// nesterov (0 or 1).
#define SGD_STEPS(T, suffix)                                                                      \
    extern "C" __global__ void sgd_steps_##suffix(const TensorEntry* tensors, const ChunkEntry* chunks, \
                                                  u32 chunk_len) {                                \
        u32 begin, end;                                                                           \
        const TensorEntry& e = chunk_of(tensors, chunks, chunk_len, &begin, &end);                \
        FOR_CHUNK(i, begin, end) {                                                                \
            sgd_update((T*)e.ptr[0], (const T*)e.ptr[1], (T*)e.ptr[2], i, e.k[0], e.k[1], e.k[2], \
                       e.k[3], e.k[4], e.k[5] != 0.0f);                                           \
        }                                                                                         \
    }
FOR_FLOATS(SGD_STEPS)

// The block's values added by a fixed tree (blockDim.x a power of two, at most 256); thread 0's
// return value is the sum.
__device__ __forceinline__ double tree_sum(double* scratch, double v) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (u32 width = blockDim.x / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) scratch[threadIdx.x] += scratch[threadIdx.x + width];
        __syncthreads();
    }
    return scratch[0];
}

// One element's share of sum_of_squares and of non_finite_count (1 for inf or NaN, by its bits).
template <typename T>
__device__ __forceinline__ float square_of(T v) {
    float x = to_f32(v);
    return x * x;
}
template <typename T>
__device__ __forceinline__ float non_finite_of(T v) {
    return is_finite(to_f32(v)) ? 0.0f : 1.0f;
}

// `term` summed over each chunk (ptr[0]): every thread sums its elements in f32 in order, the
// block's 256 sums are added in f64 by a fixed tree, and the chunk's sum lands in
// partials[first + b]. Blocks of 256 threads. A chunk's count of non-finite elements (at most
// 32768) is exact in f32.
#define CHUNK_SUM(name, term, T, suffix)                                                          \
    extern "C" __global__ void name##_##suffix(const TensorEntry* tensors, const ChunkEntry* chunks, \
                                               u32 chunk_len, double* partials, u32 first) {     \
        __shared__ double scratch[256];                                                           \
        u32 begin, end;                                                                           \
        const TensorEntry& e = chunk_of(tensors, chunks, chunk_len, &begin, &end);                \
        const T* src = (const T*)e.ptr[0];                                                        \
        float acc = 0.0f;                                                                         \
        FOR_CHUNK(i, begin, end) { acc += term(src[i]); }                                         \
        double sum = tree_sum(scratch, (double)acc);                                              \
        if (threadIdx.x == 0) partials[first + blockIdx.x] = sum;                                 \
    }
#define SUM_OF_SQUARES(T, suffix) CHUNK_SUM(sum_of_squares, square_of, T, suffix)
#define NON_FINITE_COUNT(T, suffix) CHUNK_SUM(non_finite_count, non_finite_of, T, suffix)
FOR_FLOATS(SUM_OF_SQUARES)
FOR_FLOATS(NON_FINITE_COUNT)

// The chunk sums of sum_of_squares or non_finite_count added in f64 in a fixed order (one block of 256 threads: each
// thread its strided share in order, then the tree), the total written as one f32.
extern "C" __global__ void sum_partials(const double* partials, u32 n, float* out) {
    __shared__ double scratch[256];
    double acc = 0.0;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    double sum = tree_sum(scratch, acc);
    if (threadIdx.x == 0) *out = (float)sum;
}

// dst = src * factor (ptr: src, dst), the f32 factor rounded to T first and the product rounded
// once, as `binary`'s mul with the factor cast to T.
#define SCALED_COPIES(T, suffix)                                                                  \
    extern "C" __global__ void scaled_copies_##suffix(const TensorEntry* tensors, const ChunkEntry* chunks, \
                                                      u32 chunk_len, const float* factor) {       \
        u32 begin, end;                                                                           \
        const TensorEntry& e = chunk_of(tensors, chunks, chunk_len, &begin, &end);                \
        const T* src = (const T*)e.ptr[0];                                                        \
        T* dst = (T*)e.ptr[1];                                                                    \
        float f = stored<T>(*factor);                                                             \
        FOR_CHUNK(i, begin, end) { dst[i] = from_f32<T>(to_f32(src[i]) * f); }                    \
    }
FOR_FLOATS(SCALED_COPIES)

// dst = src cast to T (ptr: src f32, dst), rounded as `cast` rounds: autocast's weight copies.
#define CAST_COPIES(T, suffix)                                                                    \
    extern "C" __global__ void cast_copies_##suffix(const TensorEntry* tensors, const ChunkEntry* chunks, \
                                                    u32 chunk_len) {                              \
        u32 begin, end;                                                                           \
        const TensorEntry& e = chunk_of(tensors, chunks, chunk_len, &begin, &end);                \
        const float* src = (const float*)e.ptr[0];                                                \
        T* dst = (T*)e.ptr[1];                                                                    \
        FOR_CHUNK(i, begin, end) { dst[i] = from_f32<T>(src[i]); }                                \
    }
FOR_FLOATS(CAST_COPIES)
