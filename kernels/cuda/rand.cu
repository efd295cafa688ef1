// rand: Philox4x32-10, the counter-based generator of core/src/rng.rs, so every backend draws
// the same stream: element i is word i % 4 of block (counter + i / 4) under key `seed`, turned
// into a float with 24 random bits; normals use Box-Muller (in f64, as the CPU) on words (0,1)
// or (2,3). Uniform: a + b * u (a = low, b = high - low); normal: a + b * z (mean, std).

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

#define RAND(T, suffix)                                                                            \
    extern "C" __global__ void rand_##suffix(T* out, u32 n, u64 seed, u64 counter, u32 normal,    \
                                             double a, double b) {                                 \
        FOR_EACH(i, n) {                                                                           \
            u32 w[4];                                                                              \
            philox(seed, counter + i / 4, w);                                                      \
            double x;                                                                              \
            if (normal == 0) {                                                                     \
                x = a + b * unit_float(w[i % 4]);                                                  \
            } else {                                                                               \
                u32 pair = (i % 4) / 2 * 2;                                                        \
                double u1 = 1.0 - unit_float(w[pair]);                                             \
                double u2 = unit_float(w[pair + 1]);                                               \
                double radius = sqrt(-2.0 * log(u1));                                              \
                double angle = 6.283185307179586476925 * u2;                                       \
                x = a + b * (i % 2 == 0 ? radius * cos(angle) : radius * sin(angle));             \
            }                                                                                      \
            out[i] = from_f32<T>((float)x);                                                        \
        }                                                                                          \
    }
FOR_FLOATS(RAND)

// dropout: out = src * (u >= p ? scale : 0), u the uniform stream's element i (compared in f32,
// as the CPU does); applied to the output gradient it is its own backward pass.
#define DROPOUT(T, suffix)                                                                         \
    extern "C" __global__ void dropout_##suffix(T* out, const T* src, u32 n, u64 seed, u64 counter, \
                                                float p, float scale) {                            \
        FOR_EACH(i, n) {                                                                           \
            u32 w[4];                                                                              \
            philox(seed, counter + i / 4, w);                                                      \
            bool keep = (float)unit_float(w[i % 4]) >= p;                                          \
            out[i] = from_f32<T>(to_f32(src[i]) * (keep ? scale : 0.0f));                          \
        }                                                                                          \
    }
FOR_FLOATS(DROPOUT)

