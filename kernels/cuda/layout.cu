// copy_strided and cast. A copy moves bits (one kernel per element width); a cast converts
// through f64, which holds every f32, f16, bf16, u32 and (up to 2^53) i64 value exactly. Floats
// to integers truncate toward zero and saturate, NaN to 0, as Rust's `as` does on the CPU.

#define COPY_STRIDED(T, suffix)                                                                   \
    extern "C" __global__ void copy_strided_##suffix(T* dst, const T* src, Shape shape, View sv,  \
                                                     View dv) {                                   \
        FOR_EACH(i, shape.n) { dst[strided_index(i, shape, dv)] = src[strided_index(i, shape, sv)]; } \
    }
COPY_STRIDED(u16, u16) COPY_STRIDED(u32, u32) COPY_STRIDED(u64, u64)

__device__ __forceinline__ double widen(float x) { return x; }
__device__ __forceinline__ double widen(f16 x) { return to_f32(x); }
__device__ __forceinline__ double widen(bf16 x) { return to_f32(x); }
__device__ __forceinline__ double widen(u32 x) { return x; }
__device__ __forceinline__ double widen(long long x) { return (double)x; }

template <typename D> __device__ __forceinline__ D narrow(double x) { return from_f32<D>((float)x); }
template <> __device__ __forceinline__ u32 narrow<u32>(double x) {
    if (!(x > 0.0)) return 0u;
    if (x >= 4294967296.0) return 0xffffffffu;
    return (u32)x;
}
template <> __device__ __forceinline__ long long narrow<long long>(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775807.0) return 9223372036854775807LL;
    if (x <= -9223372036854775808.0) return (-9223372036854775807LL - 1);
    return (long long)x;
}

#define CAST(S, s, D, d)                                                                          \
    extern "C" __global__ void cast_##s##_##d(D* out, const S* src, Shape shape, View v) {        \
        FOR_EACH(i, shape.n) { out[i] = narrow<D>(widen(src[strided_index(i, shape, v)])); }      \
    }
#define CAST_FROM(S, s)                                                                           \
    CAST(S, s, float, f32) CAST(S, s, f16, f16) CAST(S, s, bf16, bf16)
FOR_FLOATS(CAST_FROM) CAST_FROM(u32, u32) CAST_FROM(long long, i64)
#define CAST_TO_INTS(S, s) CAST(S, s, u32, u32) CAST(S, s, long long, i64)
FOR_FLOATS(CAST_TO_INTS)
// Integers to integers stay exact (i64 to u32 saturates), without a trip through f64.
#define CAST_INT(S, s, D, d, expr)                                                                \
    extern "C" __global__ void cast_##s##_##d(D* out, const S* src, Shape shape, View v) {        \
        FOR_EACH(i, shape.n) {                                                                    \
            S x = src[strided_index(i, shape, v)];                                                \
            out[i] = (expr);                                                                      \
        }                                                                                         \
    }
CAST_INT(u32, u32, u32, u32, x)
CAST_INT(u32, u32, long long, i64, (long long)x)
CAST_INT(long long, i64, u32, u32, x < 0 ? 0u : (x > 4294967295LL ? 0xffffffffu : (u32)x))
CAST_INT(long long, i64, long long, i64, x)
