// The warp-wide matrix instructions of kernels/cuda/attention.cu, emulated after the PTX ISA's
// fragment layouts: each lane deposits its registers in the warp's exchange area, the warp
// meets, and each lane reads what the instruction would have given it. Included after the
// prelude (it needs f16, bf16 and to_f32); the kernel files skip their inline PTX when
// LOCKSTEP_EMULATED is defined.
#pragma once

// The 16-bit element `half` (0 low, 1 high) of a register of two, as f32.
template <typename T> inline float lk_element(u32 reg, int half) {
    T value;
    value.bits = (u16)(half ? reg >> 16 : reg & 0xffffu);
    return to_f32(value);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c (16 x 8, f32) += a (16 x 16) · b (16 x 8).
// Lane l = 4·group + t holds a's rows group and group + 8, columns 2t, 2t + 1 (a[0], a[1]) and
// 2t + 8, 2t + 9 (a[2], a[3]); b's column group, rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1);
// c's rows group (c[0], c[1]) and group + 8 (c[2], c[3]), columns 2t and 2t + 1. The hardware's
// order of the sums is unspecified; here each of c's elements adds its 16 products, summed in k
// order, at once.
template <typename T> inline void mma_16816(float c[4], const u32 a[4], u32 b0, u32 b1) {
    unsigned lane = lk_lane();
    uint32_t* words = lk_warp_words();
    for (int r = 0; r < 4; ++r) *lk_slot(words, lane, r) = a[r];
    *lk_slot(words, lane, 4) = b0;
    *lk_slot(words, lane, 5) = b1;
    const unsigned FLAG = LK_WARP_WORDS - 1;
    if (lane == 0) *lk_slot(words, 0, FLAG) = 0;
    lk_warp_sync();
    // The first lane through forms the whole 16 x 8 product a · b once, and leaves each lane's
    // four sums in that lane's words 8-11.
    if (*lk_slot(words, 0, FLAG) == 0) {
        float af[16][16], bf[16][8];
        for (unsigned l = 0; l < 32; ++l) {
            unsigned group = l / 4, t = l % 4;
            for (unsigned r = 0; r < 4; ++r) {
                u32 reg = *lk_slot(words, l, r);
                unsigned row = group + (r % 2) * 8, k = 2 * t + (r / 2) * 8;
                af[row][k] = lk_element<T>(reg, 0);
                af[row][k + 1] = lk_element<T>(reg, 1);
            }
            for (unsigned r = 0; r < 2; ++r) {
                u32 reg = *lk_slot(words, l, 4 + r);
                unsigned k = 2 * t + r * 8;
                bf[k][group] = lk_element<T>(reg, 0);
                bf[k + 1][group] = lk_element<T>(reg, 1);
            }
        }
        for (unsigned l = 0; l < 32; ++l)
            for (unsigned e = 0; e < 4; ++e) {
                unsigned row = l / 4 + (e / 2) * 8, col = 2 * (l % 4) + (e % 2);
                float sum = 0.0f;
                for (unsigned k = 0; k < 16; ++k) sum += af[row][k] * bf[k][col];
                *lk_slot(words, l, 8 + e) = __float_as_uint(sum);
            }
        *lk_slot(words, 0, FLAG) = 1;
    }
    for (int e = 0; e < 4; ++e) c[e] += __uint_as_float(*lk_slot(words, lane, 8 + e));
    lk_warp_sync();
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j..8j+7 point at rows 0-7 of matrix
// j; lane l = 4·group + t receives, of each matrix, row `group`'s columns 2t and 2t + 1 (.trans:
// column `group`'s rows 2t and 2t + 1).
inline void lk_ldmatrix_x4(u32 r[4], const u16* p, bool transpose) {
    unsigned lane = lk_lane();
    uint32_t* words = lk_warp_words();
    uint64_t address = (uint64_t)(uintptr_t)p;
    *lk_slot(words, lane, 0) = (u32)address;
    *lk_slot(words, lane, 1) = (u32)(address >> 32);
    lk_warp_sync();
    auto row_of = [words](unsigned matrix, unsigned row) {
        unsigned owner = matrix * 8 + row;
        uint64_t a = (uint64_t)*lk_slot(words, owner, 0) | ((uint64_t)*lk_slot(words, owner, 1) << 32);
        return (const u16*)(uintptr_t)a;
    };
    unsigned group = lane / 4, t = lane % 4;
    for (unsigned j = 0; j < 4; ++j) {
        u16 lo = transpose ? row_of(j, 2 * t)[group] : row_of(j, group)[2 * t];
        u16 hi = transpose ? row_of(j, 2 * t + 1)[group] : row_of(j, group)[2 * t + 1];
        r[j] = (u32)lo | ((u32)hi << 16);
    }
    lk_warp_sync();
}
inline void ldmatrix_x4(u32 r[4], const u16* p) { lk_ldmatrix_x4(r, p, false); }
inline void ldmatrix_x4_trans(u32 r[4], const u16* p) { lk_ldmatrix_x4(r, p, true); }

// ex2.approx.f32 is within 2 ulp of 2^x; the emulator's is the C library's.
inline float ex2(float x) { return exp2f(x); }
