// fill: zeros and full. The host packs the value into a word of the element's size (an f32 or
// u32, an f16 or bf16, the two halves of an i64), so one kernel per width serves every dtype.

#define FILL(T, suffix)                                                         \
    extern "C" __global__ void fill_##suffix(T* out, u32 n, T value) {          \
        FOR_EACH(i, n) { out[i] = value; }                                      \
    }
FILL(u16, u16) FILL(u32, u32) FILL(u64, u64)
