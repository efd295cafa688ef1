// Convolution and pooling over contiguous NCHW.
//   im2col:     [n, c, h, w] -> columns [c*kh*kw, n*oh*ow] (zeros where padded), so a
//               convolution is one GEMM.
//   col2im:     its adjoint; one thread per input pixel sums the columns that read it (no
//               atomics, deterministic).
//   max_pool2d: values [n, c, oh, ow] and u32 argmax indices into each h*w plane (first maximum).
//   max_pool2d_backward: one thread per input pixel sums, in window order, the gradients of the
//               windows covering it whose maximum it was (a gather: no atomics, deterministic).

struct Geometry {
    u32 n, c, h, w, kh, kw;
    u32 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    u32 oh, ow;
};

// A column row (one channel and tap) per grid row, its columns across the grid's x: the tap's
// offsets are worked out once per row, leaving three divisions per element. `total` is
// rows * cols.
#define IM2COL(T, suffix)                                                                         \
    extern "C" __global__ void im2col_##suffix(T* out, const T* src, u32 total, Geometry g) {     \
        u32 cols = g.n * g.oh * g.ow, plane = g.oh * g.ow, rows = total / max(cols, 1u);          \
        for (u32 row = blockIdx.y; row < rows; row += gridDim.y) {                                \
            u32 ch = row / (g.kh * g.kw), ki = (row / g.kw) % g.kh, kj = row % g.kw;              \
            int dy = (int)(ki * g.dil_h) - (int)g.pad_h, dx = (int)(kj * g.dil_w) - (int)g.pad_w; \
            T* dst = out + row * cols;                                                            \
            FOR_EACH(col, cols) {                                                                 \
                u32 img = col / plane, at = col % plane, oy = at / g.ow, ox = at % g.ow;          \
                int iy = (int)(oy * g.stride_h) + dy, ix = (int)(ox * g.stride_w) + dx;           \
                bool inside = iy >= 0 && iy < (int)g.h && ix >= 0 && ix < (int)g.w;               \
                dst[col] = inside ? src[((img * g.c + ch) * g.h + iy) * g.w + ix] : from_f32<T>(0.0f); \
            }                                                                                     \
        }                                                                                         \
    }
FOR_FLOATS(IM2COL)

// Here src holds the columns and out the image [n, c, h, w].
#define COL2IM(T, suffix)                                                                         \
    extern "C" __global__ void col2im_##suffix(T* out, const T* src, u32 total, Geometry g) {     \
        u32 cols = g.n * g.oh * g.ow;                                                             \
        FOR_EACH(e, total) {                                                                      \
            u32 x = e % g.w, y = (e / g.w) % g.h, ch = (e / (g.w * g.h)) % g.c;                   \
            u32 img = e / (g.w * g.h * g.c);                                                      \
            float acc = 0.0f;                                                                     \
            for (u32 ki = 0; ki < g.kh; ++ki) {                                                   \
                int ty = (int)(y + g.pad_h) - (int)(ki * g.dil_h);                                \
                if (ty < 0 || ty % (int)g.stride_h != 0 || (u32)ty / g.stride_h >= g.oh) continue; \
                u32 oy = (u32)ty / g.stride_h;                                                    \
                for (u32 kj = 0; kj < g.kw; ++kj) {                                               \
                    int tx = (int)(x + g.pad_w) - (int)(kj * g.dil_w);                            \
                    if (tx < 0 || tx % (int)g.stride_w != 0 || (u32)tx / g.stride_w >= g.ow) continue; \
                    u32 ox = (u32)tx / g.stride_w;                                                \
                    u32 row = (ch * g.kh + ki) * g.kw + kj;                                       \
                    acc += to_f32(src[row * cols + (img * g.oh + oy) * g.ow + ox]);               \
                }                                                                                 \
            }                                                                                     \
            out[e] = from_f32<T>(acc);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(COL2IM)

#define MAX_POOL2D(T, suffix)                                                                     \
    extern "C" __global__ void max_pool2d_##suffix(T* out, u32* out_index, const T* src,         \
                                                   u32 total, Geometry g) {                       \
        FOR_EACH(e, total) {                                                                      \
            u32 ox = e % g.ow, oy = (e / g.ow) % g.oh, plane = e / (g.ow * g.oh);                 \
            float best = -F32_INF;                                                                \
            u32 best_index = 0xffffffffu;                                                         \
            for (u32 ki = 0; ki < g.kh; ++ki) {                                                   \
                int iy = (int)(oy * g.stride_h + ki) - (int)g.pad_h;                              \
                for (u32 kj = 0; kj < g.kw; ++kj) {                                               \
                    int ix = (int)(ox * g.stride_w + kj) - (int)g.pad_w;                          \
                    if (iy < 0 || iy >= (int)g.h || ix < 0 || ix >= (int)g.w) continue;           \
                    u32 index = (u32)iy * g.w + (u32)ix;                                          \
                    float v = to_f32(src[plane * g.h * g.w + index]);                             \
                    if (best_index == 0xffffffffu || (!is_nan(best) && (is_nan(v) || v > best))) { \
                        best = v;                                                                 \
                        best_index = index;                                                       \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            out[e] = from_f32<T>(best);                                                           \
            out_index[e] = best_index;                                                            \
        }                                                                                         \
    }
FOR_FLOATS(MAX_POOL2D)

// The first and last window (along one axis) whose taps cover input coordinate `y` (last <
// first when none does).
__device__ __forceinline__ void covering(u32 y, u32 pad, u32 k, u32 stride, u32 count, int* first, int* last) {
    int t = (int)(y + pad), reach = t - (int)k + 1;
    *last = min(t / (int)stride, (int)count - 1);
    *first = reach > 0 ? (reach + (int)stride - 1) / (int)stride : 0;
}

#define MAX_POOL2D_BACKWARD(T, suffix)                                                            \
    extern "C" __global__ void max_pool2d_backward_##suffix(T* out, const T* grad,               \
                                                            const u32* indices, u32 total,        \
                                                            Geometry g) {                         \
        FOR_EACH(e, total) {                                                                      \
            u32 x = e % g.w, y = (e / g.w) % g.h, plane = e / (g.w * g.h), me = y * g.w + x;      \
            int oy0, oy1, ox0, ox1;                                                               \
            covering(y, g.pad_h, g.kh, g.stride_h, g.oh, &oy0, &oy1);                             \
            covering(x, g.pad_w, g.kw, g.stride_w, g.ow, &ox0, &ox1);                             \
            float acc = 0.0f;                                                                     \
            for (int oy = oy0; oy <= oy1; ++oy) {                                                 \
                for (int ox = ox0; ox <= ox1; ++ox) {                                             \
                    u32 o = (plane * g.oh + (u32)oy) * g.ow + (u32)ox;                            \
                    if (indices[o] == me) acc += to_f32(grad[o]);                                 \
                }                                                                                 \
            }                                                                                     \
            out[e] = from_f32<T>(acc);                                                            \
        }                                                                                         \
    }
FOR_FLOATS(MAX_POOL2D_BACKWARD)
