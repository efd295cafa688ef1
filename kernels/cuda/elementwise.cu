// unary, binary, bias_act (and its gradient), compare and where_cond over strided operands of
// one shape (outputs contiguous), computed in f32 for every float storage type. Op numbers are
// the ops' indices in core's UnaryOp::ALL, BinaryOp::ALL and CmpOp::ALL.

#define UNARY(T, suffix)                                                                          \
    extern "C" __global__ void unary_##suffix(T* out, const T* src, Shape shape, View v, u32 op,  \
                                              float p0, float p1) {                               \
        FOR_EACH(i, shape.n) { out[i] = from_f32<T>(apply_unary(op, to_f32(src[strided_index(i, shape, v)]), p0, p1)); } \
    }
FOR_FLOATS(UNARY)

__device__ __forceinline__ float apply_binary(u32 op, float x, float y) {
    switch (op) {
    case 0: return x + y;
    case 1: return x - y;
    case 2: return x * y;
    case 3: return x / y;
    case 4: return pow_real(x, y);
    case 5: return max_nan(x, y);
    case 6: return min_nan(x, y);
    case 7: return y > 0.0f ? x : 0.0f; /* relu_grad: the gradient x where the input y > 0 */
    default: return x;
    }
}

#define BINARY(T, suffix)                                                                         \
    extern "C" __global__ void binary_##suffix(T* out, const T* lhs, const T* rhs, Shape shape,   \
                                               View lv, View rv, u32 op) {                        \
        FOR_EACH(i, shape.n) {                                                                    \
            float x = to_f32(lhs[strided_index(i, shape, lv)]);                                   \
            float y = to_f32(rhs[strided_index(i, shape, rv)]);                                   \
            out[i] = from_f32<T>(apply_binary(op, x, y));                                         \
        }                                                                                         \
    }
FOR_FLOATS(BINARY)

// An f32 operand and a half one (`narrow_lhs`: the half one is lhs), the half one widened
// exactly: the bits of a cast then binary_f32 (Backend::binary_mixed), binary_f32_and_<half>.
#define BINARY_MIXED(H, suffix)                                                                   \
    extern "C" __global__ void binary_f32_and_##suffix(float* out, const float* wide, const H* narrow, \
                                                       Shape shape, View wv, View nv, u32 op,     \
                                                       u32 narrow_lhs) {                          \
        FOR_EACH(i, shape.n) {                                                                    \
            float w = wide[strided_index(i, shape, wv)];                                          \
            float n = to_f32(narrow[strided_index(i, shape, nv)]);                                \
            out[i] = narrow_lhs ? apply_binary(op, n, w) : apply_binary(op, w, n);                \
        }                                                                                         \
    }
BINARY_MIXED(f16, f16) BINARY_MIXED(bf16, bf16)

// The elements of a contiguous [outer, channels, inner] (n of them) with each one's channel, in
// rows that grid y walks and grid x covers (a rows_grid launch): with inner 1 (a linear layer's
// [rows, channels]) a row is an outer index and its columns the channels; else a row is one
// channel's `inner` elements, its channel found once a row. No thread divides per element.
template <typename F>
__device__ __forceinline__ void for_each_biased(u32 n, u32 channels, u32 inner, F f) {
    bool per_column = inner == 1;
    u32 cols = per_column ? channels : inner;
    u32 rows = n / cols;
    for (u32 row = blockIdx.y; row < rows; row += gridDim.y) {
        u32 row_channel = per_column ? 0 : row % channels;
        for (u32 col = blockIdx.x * blockDim.x + threadIdx.x; col < cols; col += blockDim.x * gridDim.x) {
            f(row * cols + col, per_column ? col : row_channel);
        }
    }
}

// out[o, c, i] = act(src[o, c, i] + bias[c]) over a contiguous [outer, channels, inner];
// act = NO_ACT for the bias alone.
#define NO_ACT 0xffffffffu
#define BIAS_ACT(T, suffix)                                                                       \
    extern "C" __global__ void bias_act_##suffix(T* out, const T* src, const T* bias, u32 n,      \
                                                 u32 channels, u32 inner, u32 act, float p0,      \
                                                 float p1) {                                      \
        for_each_biased(n, channels, inner, [&](u32 i, u32 c) {                                   \
            float pre = to_f32(src[i]) + to_f32(bias[c]);                                         \
            out[i] = from_f32<T>(act == NO_ACT ? pre : apply_unary(act, pre, p0, p1));            \
        });                                                                                       \
    }
FOR_FLOATS(BIAS_ACT)

// The gradient of bias_act's input for an activation whose derivative is the unary op
// `derivative` of its input: grad * derivative(src + bias[c]), rounded to T after the add and
// after the derivative, where the composed add, unary and multiply store their results.
#define BIAS_ACT_GRAD(T, suffix)                                                                  \
    extern "C" __global__ void bias_act_grad_##suffix(T* out, const T* grad, const T* src,        \
                                                      const T* bias, u32 n, u32 channels,         \
                                                      u32 inner, u32 derivative, float p0,        \
                                                      float p1) {                                 \
        for_each_biased(n, channels, inner, [&](u32 i, u32 c) {                                   \
            float pre = stored<T>(to_f32(src[i]) + to_f32(bias[c]));                              \
            float slope = stored<T>(apply_unary(derivative, pre, p0, p1));                        \
            out[i] = from_f32<T>(to_f32(grad[i]) * slope);                                        \
        });                                                                                       \
    }
FOR_FLOATS(BIAS_ACT_GRAD)

// Comparisons see floats as f32 and integers as themselves; every one but != fails on NaN.
__device__ __forceinline__ float comparable(float x) { return x; }
__device__ __forceinline__ float comparable(f16 x) { return to_f32(x); }
__device__ __forceinline__ float comparable(bf16 x) { return to_f32(x); }
__device__ __forceinline__ u32 comparable(u32 x) { return x; }
__device__ __forceinline__ long long comparable(long long x) { return x; }

template <typename V> __device__ __forceinline__ bool holds(u32 op, V x, V y) {
    switch (op) {
    case 0: return x == y;
    case 1: return !(x == y);
    case 2: return x < y;
    case 3: return x <= y;
    case 4: return x > y;
    case 5: return x >= y;
    default: return false;
    }
}

#define COMPARE(T, suffix)                                                                        \
    extern "C" __global__ void compare_##suffix(u32* out, const T* lhs, const T* rhs, Shape shape, \
                                                View lv, View rv, u32 op) {                       \
        FOR_EACH(i, shape.n) {                                                                    \
            out[i] = holds(op, comparable(lhs[strided_index(i, shape, lv)]),                      \
                           comparable(rhs[strided_index(i, shape, rv)])) ? 1u : 0u;               \
        }                                                                                         \
    }
FOR_FLOATS(COMPARE) COMPARE(u32, u32) COMPARE(long long, i64)

// A select moves bits, so one kernel per element width serves every dtype.
#define WHERE_COND(T, suffix)                                                                     \
    extern "C" __global__ void where_cond_##suffix(T* out, const u32* cond, const T* on_true,      \
                                                   const T* on_false, Shape shape, View cv,       \
                                                   View tv, View fv) {                            \
        FOR_EACH(i, shape.n) {                                                                    \
            out[i] = cond[strided_index(i, shape, cv)] != 0u ? on_true[strided_index(i, shape, tv)] \
                                                             : on_false[strided_index(i, shape, fv)]; \
        }                                                                                         \
    }
WHERE_COND(u16, u16) WHERE_COND(u32, u32) WHERE_COND(u64, u64)
