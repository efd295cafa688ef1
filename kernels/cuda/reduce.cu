// reduce: sum, max, min or argmax over some axes. A group of G threads (G = 32 for short
// reductions, 256 for long ones; 256 / G outputs per block) strides over one output's reduced
// elements and combines in shared memory in a fixed order, so results are deterministic. Sums
// accumulate in f32 for every storage type; argmax returns the first index of the maximum.

struct SubShape {
    u32 rank;
    u32 dims[MAX_RANK];
    u32 strides[MAX_RANK];
};

__device__ __forceinline__ u32 sub_offset(u32 i, const SubShape& s) {
    u32 index = 0;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        index += (i % s.dims[d]) * s.strides[d];
        i /= s.dims[d];
    }
    return index;
}

#define KIND_SUM 0u
#define KIND_MIN 2u
#define KIND_ARGMAX 3u
#define NONE 0xffffffffu

// Whether (a, ia) beats (b, ib): larger (smaller for min), ties to the smaller index; NaN beats
// every number (the first NaN wins), as on the CPU and in PyTorch.
__device__ __forceinline__ bool better(u32 kind, float a, u32 ia, float b, u32 ib) {
    if (ib == NONE) return true;
    if (is_nan(a) || is_nan(b)) return is_nan(a) && (!is_nan(b) || ia < ib);
    if (kind == KIND_MIN) return a < b || (a == b && ia < ib);
    return a > b || (a == b && ia < ib);
}

#define REDUCE(T, suffix)                                                                         \
    extern "C" __global__ void reduce_##suffix(T* out, u32* out_index, const T* src, u32 n_out,    \
                                               u32 n_red, u32 offset, SubShape kept,              \
                                               SubShape red, u32 kind, u32 group) {               \
        __shared__ float value[256];                                                              \
        __shared__ u32 index[256];                                                                \
        u32 lane = threadIdx.x % group;                                                           \
        u32 o = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                          \
        u32 base = offset + sub_offset(o < n_out ? o : 0, kept);                                  \
        float acc = kind == KIND_SUM ? 0.0f : (kind == KIND_MIN ? F32_INF : -F32_INF);            \
        u32 acc_index = NONE;                                                                     \
        if (o < n_out) {                                                                          \
            for (u32 r = lane; r < n_red; r += group) {                                           \
                float x = to_f32(src[base + sub_offset(r, red)]);                                 \
                if (kind == KIND_SUM) {                                                           \
                    acc += x;                                                                     \
                } else if (better(kind, x, r, acc, acc_index)) {                                  \
                    acc = x;                                                                      \
                    acc_index = r;                                                                \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        value[threadIdx.x] = acc;                                                                 \
        index[threadIdx.x] = acc_index;                                                           \
        __syncthreads();                                                                          \
        for (u32 width = group / 2; width > 0; width /= 2) {                                      \
            if (lane < width) {                                                                   \
                float other = value[threadIdx.x + width];                                         \
                u32 other_index = index[threadIdx.x + width];                                     \
                if (kind == KIND_SUM) {                                                           \
                    value[threadIdx.x] += other;                                                  \
                } else if (other_index != NONE &&                                                 \
                           better(kind, other, other_index, value[threadIdx.x], index[threadIdx.x])) { \
                    value[threadIdx.x] = other;                                                   \
                    index[threadIdx.x] = other_index;                                             \
                }                                                                                 \
            }                                                                                     \
            __syncthreads();                                                                      \
        }                                                                                         \
        if (lane == 0 && o < n_out) {                                                             \
            if (kind == KIND_ARGMAX) {                                                            \
                out_index[o] = index[threadIdx.x];                                                \
            } else {                                                                              \
                out[o] = from_f32<T>(value[threadIdx.x]);                                         \
            }                                                                                     \
        }                                                                                         \
    }
FOR_FLOATS(REDUCE)
