// rand: Philox4x32-10, the counter-based generator of core/src/rng.rs, so every backend draws
// the same stream: element i is word i % 4 of block (counter + i / 4) under key `seed`, turned
// into a float with 24 random bits; normals use Box-Muller (in f64, as the CPU) on words (0,1)
// or (2,3). Uniform: a + b * u (a = low, b = high - low); normal: a + b * z (mean, std).

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

