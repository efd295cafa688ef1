// In-place optimizer updates on contiguous parameters and state, PyTorch semantics, in f32; the
// host folds the step's constants (bias corrections, decay factors) in f64 as the CPU does.
//   axpy:      dst += alpha * src
//   sgd_step:  with a momentum buffer when `momentum_buf` is non-null
//   adam_step: exp_avg and exp_avg_sq as state

#define AXPY(T, suffix)                                                                           \
    extern "C" __global__ void axpy_##suffix(T* dst, const T* src, u32 n, float alpha) {          \
        FOR_EACH(i, n) { dst[i] = from_f32<T>(to_f32(dst[i]) + alpha * to_f32(src[i])); }         \
    }
FOR_FLOATS(AXPY)

// keep = momentum (0 on the first step), take = 1 - dampening (1 on the first step).
#define SGD_STEP(T, suffix)                                                                       \
    extern "C" __global__ void sgd_step_##suffix(T* param, const T* grad, T* momentum_buf, u32 n, \
                                                 float lr, float weight_decay, float keep,        \
                                                 float take, float momentum, u32 nesterov) {      \
        FOR_EACH(i, n) {                                                                          \
            float p = to_f32(param[i]);                                                           \
            float d = to_f32(grad[i]) + weight_decay * p;                                         \
            if (momentum_buf) {                                                                   \
                float b = keep * to_f32(momentum_buf[i]) + take * d;                              \
                momentum_buf[i] = from_f32<T>(b);                                                 \
                d = nesterov ? d + momentum * b : b;                                              \
            }                                                                                     \
            param[i] = from_f32<T>(p - lr * d);                                                   \
        }                                                                                         \
    }
FOR_FLOATS(SGD_STEP)

// decay: 1 - lr * wd for AdamW (else 1); l2: wd for Adam (else 0).
#define ADAM_STEP(T, suffix)                                                                      \
    extern "C" __global__ void adam_step_##suffix(T* param, const T* grad, T* exp_avg,            \
                                                  T* exp_avg_sq, u32 n, float decay, float l2,    \
                                                  float beta1, float one_minus_beta1, float beta2, \
                                                  float one_minus_beta2, float step_size,         \
                                                  float bias2_sqrt, float eps) {                  \
        FOR_EACH(i, n) {                                                                          \
            float p = to_f32(param[i]) * decay;                                                   \
            float g = to_f32(grad[i]) + l2 * p;                                                   \
            float m = beta1 * to_f32(exp_avg[i]) + one_minus_beta1 * g;                           \
            float v = beta2 * to_f32(exp_avg_sq[i]) + one_minus_beta2 * g * g;                    \
            exp_avg[i] = from_f32<T>(m);                                                          \
            exp_avg_sq[i] = from_f32<T>(v);                                                       \
            param[i] = from_f32<T>(p - step_size * m / (sqrtf(v) / bias2_sqrt + eps));            \
        }                                                                                         \
    }
FOR_FLOATS(ADAM_STEP)
