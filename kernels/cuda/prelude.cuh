// Shared by every Lockstep kernel: NVRTC compiles this prelude followed by one kernel file, so
// the files need no #include (NVRTC ships no standard headers, and none are needed).
//
// The CPU emulator (backend-cuda/emulator) compiles the same files as C++ with LOCKSTEP_EMULATED
// defined, which swaps the few lines of inline PTX for portable ones.
//
// Storage types: `float`, `f16`, `bf16` (16-bit words with conversions written here), `u32`,
// `u64`. Every float kernel computes in f32 and stores with one rounding, as the CPU and wgpu
// backends do. Kernel names are `<op>_<dtype>` (`unary_f32`, `unary_bf16`), instantiated by the
// FOR_FLOATS macro at the end of each file.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

struct f16 { u16 bits; };
struct bf16 { u16 bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(u32 x) { return (float)x; }
__device__ __forceinline__ float to_f32(f16 x) {
#ifdef LOCKSTEP_EMULATED
    return lk_half_to_float(x.bits);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
#endif
}
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
    f16 h;
#ifdef LOCKSTEP_EMULATED
    h.bits = lk_float_to_half(x);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
#endif
    return h;
}
// Round to nearest even, NaN kept quiet (as half::bf16::from_f32 does on the CPU).
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
    u32 u = __float_as_uint(x);
    bf16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (u16)((u >> 16) | 0x0040u);
    } else {
        b.bits = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
}
// Floats to u32 truncate toward zero and saturate (NaN to 0), like Rust's `as`.
template <> __device__ __forceinline__ u32 from_f32<u32>(float x) {
    if (!(x > 0.0f)) return 0u;
    if (x >= 4294967296.0f) return 0xffffffffu;
    return (u32)x;
}
// `x` as T holds it: what a fused kernel carries between the steps the composed ops would store.
template <typename T> __device__ __forceinline__ float stored(float x) { return to_f32(from_f32<T>(x)); }

// Tensors of up to MAX_RANK dimensions; the host merges dimensions that are contiguous in every
// operand first, so most tensors arrive as rank 1 and pay one division per element.
#define MAX_RANK 8

struct Shape {
    u32 n;
    u32 rank;
    u32 dims[MAX_RANK];
};

struct View {
    u32 offset;
    u32 strides[MAX_RANK];
};

// Where element `i` (row-major over `shape`) lives in an operand viewed through `v`. A
// contiguous operand reaches here as rank 1 (the host merges dimensions) and costs no division.
// The loop is unrolled over MAX_RANK so the parameter arrays are indexed by constants: indexed by
// `rank`, they were copied to a stack frame in every thread (112 bytes for a binary op) and read
// back from local memory for each element.
__device__ __forceinline__ u32 strided_index(u32 i, const Shape& shape, const View& v) {
    if (shape.rank <= 1) return v.offset + i * v.strides[0];
    u32 index = v.offset;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < (int)shape.rank) {
            u32 size = shape.dims[d];
            index += (i % size) * v.strides[d];
            i /= size;
        }
    }
    return index;
}

// Grid-stride loop over n elements: any grid size covers any n.
#define FOR_EACH(i, n) for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

// Instantiates `M(T, suffix)` for every float storage type.
#define FOR_FLOATS(M) M(float, f32) M(f16, f16) M(bf16, bf16)

#define F32_INF __int_as_float(0x7f800000)
#define F32_NAN __int_as_float(0x7fc00000)

// NaN and infinities by their bits, so no compiler option can assume them away.
__device__ __forceinline__ bool is_nan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool is_finite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }
// The larger / smaller of a and b, NaN if either is (PyTorch's maximum, relu, clamp and max
// reductions; fmaxf would drop the NaN).
__device__ __forceinline__ float max_nan(float a, float b) { return is_nan(a) || a > b ? a : b; }
__device__ __forceinline__ float min_nan(float a, float b) { return is_nan(a) || a < b ? a : b; }

// x^y with C's rules for a negative base (real only for an integer exponent).
__device__ __forceinline__ float pow_real(float x, float y) { return powf(x, y); }

#define INV_SQRT2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

// Unary op number `op` (its index in core's UnaryOp::ALL) with parameters p0, p1.
__device__ __forceinline__ float apply_unary(u32 op, float x, float p0, float p1) {
    switch (op) {
    case 0: return -x;
    case 1: return fabsf(x);
    case 2: return expf(x);
    case 3: return logf(x);
    case 4: return sqrtf(x);
    case 5: return 1.0f / x;
    case 6: return tanhf(x);
    case 7: return 1.0f / (1.0f + expf(-x));
    case 8: return max_nan(x, 0.0f);
    case 9: return x * 0.5f * (1.0f + erff(x * INV_SQRT2));
    case 10: return 0.5f * (1.0f + erff(x * INV_SQRT2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
    case 11: return pow_real(x, p0);
    case 12: return x * p0 + p1;
    case 13: return max_nan(x, p0);
    case 14: return min_nan(x, p0);
    case 15: return is_finite(x) ? 0.0f : 1.0f;
    default: return x;
    }
}

// Row kernels (softmax, layer_norm): a group of `group` threads per row (lane = its index in
// the group) combines its values in shared memory `scratch` (one float per thread of the block).
// Combines the group's values into every member's return value: the maximum, or the sum.
__device__ __forceinline__ float combine(float* scratch, u32 lane, u32 group, float v, bool take_max) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (u32 width = group / 2; width > 0; width /= 2) {
        if (lane < width) {
            float other = scratch[threadIdx.x + width];
            scratch[threadIdx.x] = take_max ? max_nan(scratch[threadIdx.x], other) : scratch[threadIdx.x] + other;
        }
        __syncthreads();
    }
    float result = scratch[threadIdx.x - lane];
    __syncthreads();
    return result;
}

// Philox4x32-10, the counter-based generator of core/src/rng.rs: rand.cu's draws and dropout,
// and the fused attention weights' dropout.
__device__ __forceinline__ void philox(u64 key, u64 counter, u32 out[4]) {
    u32 k0 = (u32)key, k1 = (u32)(key >> 32);
    u32 c0 = (u32)counter, c1 = (u32)(counter >> 32), c2 = 0, c3 = 0;
    for (int round = 0; round < 10; ++round) {
        u64 p0 = (u64)0xD2511F53u * c0;
        u64 p1 = (u64)0xCD9E8D57u * c2;
        u32 n0 = (u32)(p1 >> 32) ^ c1 ^ k0;
        u32 n1 = (u32)p1;
        u32 n2 = (u32)(p0 >> 32) ^ c3 ^ k1;
        u32 n3 = (u32)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

__device__ __forceinline__ double unit_float(u32 word) { return (double)(word >> 8) * (1.0 / 16777216.0); }
