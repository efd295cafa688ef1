// Indexing over contiguous [outer, dim, inner] views with u32 indices. Selections move bits
// (one kernel per element width). Indices outside the indexed dimension select zeros and add
// nothing.

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

// The in-place adds: dst[o, id, i] += src[o, j, i] for id = ids[j] (index_add, per_element = 0)
// or ids[o, j, i] (scatter_add, per_element = 1); dst is [outer, dst_dim, inner] and src [outer,
// src_dim, inner]. One thread per destination element sums, in f32 rounded once, the sources
// aimed at it in increasing j. Either it scans every source (add_at: cheap when there are few), or
// link_sources first threads each id's sources into a list in increasing j (first[slot] ->
// next[position] -> .. -> NONE) and add_linked walks only its own list.

#define NONE 0xffffffffu

// Row j of the ids of the source column (o, i) is at base + j * step (index_add: one column);
// `next` is laid out the same way.
struct Column {
    u32 base, step;
};

__device__ __forceinline__ Column column_of(u32 o, u32 i, u32 src_dim, u32 inner, u32 per_element) {
    Column c;
    c.base = per_element ? o * src_dim * inner + i : 0u;
    c.step = per_element ? inner : 1u;
    return c;
}

#define ADD_AT(T, suffix)                                                                         \
    extern "C" __global__ void add_at_##suffix(T* dst, const T* src, const u32* ids, u32 n,       \
                                               u32 src_dim, u32 inner, u32 dst_dim,               \
                                               u32 per_element) {                                 \
        FOR_EACH(e, n) {                                                                          \
            u32 o = e / (dst_dim * inner), row = (e / inner) % dst_dim, i = e % inner;            \
            Column c = column_of(o, i, src_dim, inner, per_element);                              \
            float acc = to_f32(dst[e]);                                                           \
            for (u32 j = 0; j < src_dim; ++j) {                                                   \
                if (ids[c.base + j * c.step] == row) acc += to_f32(src[(o * src_dim + j) * inner + i]); \
            }                                                                                     \
            dst[e] = from_f32<T>(acc);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(ADD_AT)

// One thread per source position (a row j of index_add's ids, an element of scatter_add's): links
// it to the next row of its column with the same id and offers j as its list's first. A search
// forward, so O(src_dim) per position at worst, but no destination factor. `first` (one list per
// destination row, or per destination element for scatter_add) holds NONE before.
extern "C" __global__ void link_sources(u32* first, u32* next, const u32* ids, u32 positions, u32 src_dim,
                                        u32 inner, u32 dst_dim, u32 per_element) {
    FOR_EACH(p, positions) {
        u32 o = 0, j = p, i = 0;
        if (per_element) {
            o = p / (src_dim * inner);
            j = (p / inner) % src_dim;
            i = p % inner;
        }
        u32 id = ids[p];
        if (id >= dst_dim) continue; // adds nothing, and no list reaches it
        Column c = column_of(o, i, src_dim, inner, per_element);
        u32 k = j + 1;
        while (k < src_dim && ids[c.base + k * c.step] != id) ++k;
        next[p] = k < src_dim ? k : NONE;
        atomicMin(&first[per_element ? (o * dst_dim + id) * inner + i : id], j);
    }
}

#define ADD_LINKED(T, suffix)                                                                     \
    extern "C" __global__ void add_linked_##suffix(T* dst, const T* src, const u32* first,        \
                                                   const u32* next, u32 n, u32 src_dim,           \
                                                   u32 inner, u32 dst_dim, u32 per_element) {     \
        FOR_EACH(e, n) {                                                                          \
            u32 o = e / (dst_dim * inner), row = (e / inner) % dst_dim, i = e % inner;            \
            Column c = column_of(o, i, src_dim, inner, per_element);                              \
            float acc = to_f32(dst[e]);                                                           \
            for (u32 j = first[per_element ? e : row]; j != NONE; j = next[c.base + j * c.step]) { \
                acc += to_f32(src[(o * src_dim + j) * inner + i]);                                \
            }                                                                                     \
            dst[e] = from_f32<T>(acc);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(ADD_LINKED)
