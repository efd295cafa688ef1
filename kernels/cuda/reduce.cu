// reduce: sum, max, min or argmax over some axes. A group of G threads (G = 32 for short
// reductions, 256 for long ones; 256 / G groups per block) strides over one chunk of an output's
// reduced elements and combines in shared memory in a fixed order, so results are deterministic.
// An output is one chunk unless the outputs are too few to fill the GPU: then the host splits
// each into chunks (from the shape alone, so every GPU sums in the same order) and
// combine_chunks folds their partials in order. Sums accumulate in f32 for every storage type;
// argmax returns the first index of the maximum.

struct SubShape {
    u32 rank;
    u32 dims[MAX_RANK];
    u32 strides[MAX_RANK];
};

// Unrolled over MAX_RANK for constant indices, as strided_index (prelude.cuh) is.
__device__ __forceinline__ u32 sub_offset(u32 i, const SubShape& s) {
    if (s.rank <= 1) return i * s.strides[0];
    u32 index = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < (int)s.rank) {
            index += (i % s.dims[d]) * s.strides[d];
            i /= s.dims[d];
        }
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

// A running reduction: the sum (index NONE), or the best value so far and its index (NONE before
// the first).
struct Acc {
    float value;
    u32 index;
};

__device__ __forceinline__ Acc empty_acc(u32 kind) {
    Acc a;
    a.value = kind == KIND_SUM ? 0.0f : (kind == KIND_MIN ? F32_INF : -F32_INF);
    a.index = NONE;
    return a;
}

// `a` with (x, ix) taken in; an extremum skips an empty partial (index NONE).
__device__ __forceinline__ Acc take(u32 kind, Acc a, float x, u32 ix) {
    if (kind == KIND_SUM) {
        a.value += x;
    } else if (ix != NONE && better(kind, x, ix, a.value, a.index)) {
        a.value = x;
        a.index = ix;
    }
    return a;
}

// Combines the accumulators of each group of `group` threads in shared memory (`value`, `index`:
// one slot per thread of the block); lane 0 of each group returns the group's result.
__device__ __forceinline__ Acc combine(u32 kind, Acc a, u32 lane, u32 group, float* value, u32* index) {
    value[threadIdx.x] = a.value;
    index[threadIdx.x] = a.index;
    __syncthreads();
    for (u32 width = group / 2; width > 0; width /= 2) {
        if (lane < width) {
            Acc c;
            c.value = value[threadIdx.x];
            c.index = index[threadIdx.x];
            c = take(kind, c, value[threadIdx.x + width], index[threadIdx.x + width]);
            value[threadIdx.x] = c.value;
            index[threadIdx.x] = c.index;
        }
        __syncthreads();
    }
    Acc r;
    r.value = value[threadIdx.x];
    r.index = index[threadIdx.x];
    return r;
}

// Each group reduces chunk w = o * chunks + c: reduced elements [c * chunk_len, (c + 1) *
// chunk_len) of output o. With one chunk per output (chunk_len >= n_red) it writes the output;
// else the chunk's partial (f32 value and index) for combine_chunks.
#define REDUCE(T, suffix)                                                                         \
    extern "C" __global__ void reduce_##suffix(T* out, u32* out_index, float* chunk_value,         \
                                               u32* chunk_index, const T* src, u32 n_out,         \
                                               u32 n_red, u32 offset, SubShape kept,              \
                                               SubShape red, u32 kind, u32 group,                 \
                                               u32 chunk_len) {                                   \
        __shared__ float value[256];                                                              \
        __shared__ u32 index[256];                                                                \
        u32 lane = threadIdx.x % group;                                                           \
        u32 chunks = max((n_red + chunk_len - 1) / chunk_len, 1u);                                \
        u32 w = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                          \
        u32 o = w / chunks;                                                                       \
        Acc a = empty_acc(kind);                                                                  \
        if (o < n_out) {                                                                          \
            u32 base = offset + sub_offset(o, kept);                                              \
            u32 start = (w % chunks) * chunk_len, end = min(start + chunk_len, n_red);            \
            for (u32 r = start + lane; r < end; r += group) {                                     \
                a = take(kind, a, to_f32(src[base + sub_offset(r, red)]), r);                     \
            }                                                                                     \
        }                                                                                         \
        a = combine(kind, a, lane, group, value, index);                                          \
        if (lane == 0 && o < n_out) {                                                             \
            if (chunks > 1) {                                                                     \
                chunk_value[w] = a.value;                                                         \
                chunk_index[w] = a.index;                                                         \
            } else if (kind == KIND_ARGMAX) {                                                     \
                out_index[o] = a.index;                                                           \
            } else {                                                                              \
                out[o] = from_f32<T>(a.value);                                                    \
            }                                                                                     \
        }                                                                                         \
    }
FOR_FLOATS(REDUCE)

// Column reductions, where the kept elements are one contiguous run (stride 1): thread o of the
// grid's x reads output o's column, so a warp reads 32 neighbouring elements a step instead of 32
// elements a row apart (a bias gradient: [tokens, features] summed over tokens). Block row y takes
// chunk y of the reduced elements, in order; with one chunk it writes the output, else the
// chunk's partial at [o * chunks + y] for combine_chunks, as reduce does.
#define REDUCE_COLUMNS(T, suffix)                                                                 \
    extern "C" __global__ void reduce_columns_##suffix(T* out, u32* out_index, float* chunk_value, \
                                                       u32* chunk_index, const T* src, u32 n_out, \
                                                       u32 n_red, u32 offset, SubShape red,       \
                                                       u32 kind, u32 chunk_len) {                 \
        u32 o = blockIdx.x * blockDim.x + threadIdx.x;                                            \
        u32 chunks = gridDim.y, c = blockIdx.y;                                                   \
        if (o >= n_out) return;                                                                   \
        Acc a = empty_acc(kind);                                                                  \
        u32 start = c * chunk_len, end = min(start + chunk_len, n_red);                           \
        for (u32 r = start; r < end; ++r) {                                                       \
            a = take(kind, a, to_f32(src[offset + o + sub_offset(r, red)]), r);                   \
        }                                                                                         \
        if (chunks > 1) {                                                                         \
            chunk_value[o * chunks + c] = a.value;                                                \
            chunk_index[o * chunks + c] = a.index;                                                \
        } else if (kind == KIND_ARGMAX) {                                                         \
            out_index[o] = a.index;                                                               \
        } else {                                                                                  \
            out[o] = from_f32<T>(a.value);                                                        \
        }                                                                                         \
    }
FOR_FLOATS(REDUCE_COLUMNS)

// Pass 2 of a split reduction: each group folds one output's `chunks` partials in order.
#define COMBINE_CHUNKS(T, suffix)                                                                 \
    extern "C" __global__ void combine_chunks_##suffix(T* out, u32* out_index,                    \
                                                       const float* chunk_value,                  \
                                                       const u32* chunk_index, u32 n_out,         \
                                                       u32 chunks, u32 kind, u32 group) {         \
        __shared__ float value[256];                                                              \
        __shared__ u32 index[256];                                                                \
        u32 lane = threadIdx.x % group;                                                           \
        u32 o = blockIdx.x * (blockDim.x / group) + threadIdx.x / group;                          \
        Acc a = empty_acc(kind);                                                                  \
        if (o < n_out) {                                                                          \
            for (u32 c = lane; c < chunks; c += group) {                                          \
                a = take(kind, a, chunk_value[o * chunks + c], chunk_index[o * chunks + c]);      \
            }                                                                                     \
        }                                                                                         \
        a = combine(kind, a, lane, group, value, index);                                          \
        if (lane == 0 && o < n_out) {                                                             \
            if (kind == KIND_ARGMAX) {                                                            \
                out_index[o] = a.index;                                                           \
            } else {                                                                              \
                out[o] = from_f32<T>(a.value);                                                    \
            }                                                                                     \
        }                                                                                         \
    }
FOR_FLOATS(COMBINE_CHUNKS)
