// Indexing over contiguous [outer, dim, inner] views with u32 indices. Selections move bits
// (one kernel per element width). The in-place adds run one thread per destination element
// that sums every source element aimed at it, in order: no atomics, so repeated indices give
// deterministic results. Indices outside the indexed dimension select zeros and add nothing.

// src[o, id, i] for output element e of [outer, out_dim, inner], or zero when id is out of range.
#define PICK(T)                                                                                   \
    u32 o = e / (out_dim * inner), i = e % inner;                                                 \
    out[e] = id < src_dim ? src[(o * src_dim + id) * inner + i] : (T)0;

// out[o, j, i] = src[o, ids[j], i]
#define INDEX_SELECT(T, suffix)                                                                   \
    extern "C" __global__ void index_select_##suffix(T* out, const T* src, const u32* ids, u32 n, \
                                                     u32 src_dim, u32 inner, u32 out_dim) {       \
        FOR_EACH(e, n) {                                                                          \
            u32 id = ids[(e / inner) % out_dim];                                                  \
            PICK(T)                                                                               \
        }                                                                                         \
    }
// out[o, j, i] = src[o, ids[o, j, i], i]
#define GATHER(T, suffix)                                                                         \
    extern "C" __global__ void gather_##suffix(T* out, const T* src, const u32* ids, u32 n,       \
                                               u32 src_dim, u32 inner, u32 out_dim) {             \
        FOR_EACH(e, n) {                                                                          \
            u32 id = ids[e];                                                                      \
            PICK(T)                                                                               \
        }                                                                                         \
    }
INDEX_SELECT(u16, u16) INDEX_SELECT(u32, u32) INDEX_SELECT(u64, u64)
GATHER(u16, u16) GATHER(u32, u32) GATHER(u64, u64)

// dst[o, ids[j], i] += src[o, j, i] (per_element = 0) or dst[o, ids[o, j, i], i] += src[o, j, i]
// (per_element = 1); dst is [outer, dst_dim, inner] and src [outer, src_dim, inner].
#define ADD_AT(T, suffix)                                                                         \
    extern "C" __global__ void add_at_##suffix(T* dst, const T* src, const u32* ids, u32 n,       \
                                               u32 src_dim, u32 inner, u32 dst_dim,               \
                                               u32 per_element) {                                 \
        FOR_EACH(e, n) {                                                                          \
            u32 o = e / (dst_dim * inner), row = (e / inner) % dst_dim, i = e % inner;            \
            float acc = to_f32(dst[e]);                                                           \
            for (u32 j = 0; j < src_dim; ++j) {                                                   \
                u32 s = (o * src_dim + j) * inner + i;                                            \
                if (ids[per_element ? s : j] == row) acc += to_f32(src[s]);                       \
            }                                                                                     \
            dst[e] = from_f32<T>(acc);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(ADD_AT)
