// CUDA's kernel dialect as plain C++, so kernels/cuda/*.cu compile for the CPU emulator: each
// CUDA thread of a block is a fiber of the OS thread that launched the kernel (blocks.cpp), the
// thread, block and grid indices are that fiber's, and barriers and warp exchanges switch fibers.
// Included before kernels/cuda/prelude.cuh; `LOCKSTEP_EMULATED` selects the few portable
// definitions the kernel files keep beside their inline PTX.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#define LOCKSTEP_EMULATED 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Shared memory is per block; blocks run one after another on a launching OS thread.
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

namespace lk {
struct uint3 {
    unsigned x, y, z;
};
}  // namespace lk

// CUDA's vector types the kernels use.
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
// CUDA's 16-byte vector (one 128-bit load or store).
struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// What a CUDA thread knows of itself, at the lowest address of its fiber's stack: each stack is
// LK_STACK_BYTES long and aligned to its length, so a thread finds its own from any address on
// its stack (no thread-local storage, which costs a call in a dlopen'ed library).
#define LK_STACK_BYTES (64 * 1024)
#define LK_WARP_WORDS 16
// A cp.async copy issued and not yet landed (async_copy.h): `bytes` at dst, the first
// `src_bytes` of them from src, the rest zeros; `group` is the commit group it joins.
struct LkAsyncCopy {
    void* dst;
    const void* src;
    unsigned bytes, src_bytes, group;
};
#define LK_ASYNC_COPIES 32
struct LkThread {
    lk::uint3 thread_idx, block_idx, block_dim, grid_dim;
    unsigned lane;
    uint32_t* warp_words;  // the warp's exchange area: LK_WARP_WORDS words for each lane
    void* block;           // the scheduler's state (blocks.cpp)
    unsigned async_committed, async_pending;  // commit groups closed; copies in `async`
    LkAsyncCopy async[LK_ASYNC_COPIES];
};
inline void lk_land(const LkAsyncCopy& copy) {
    memcpy(copy.dst, copy.src, copy.src_bytes);
    memset((char*)copy.dst + copy.src_bytes, 0, copy.bytes - copy.src_bytes);
}
// Lands the thread's copies of every group but the newest `in_flight` committed ones (all of
// them, uncommitted too, when `in_flight` is negative: the thread has finished).
inline void lk_land_copies(LkThread* self, int in_flight) {
    unsigned kept = 0;
    for (unsigned i = 0; i < self->async_pending; ++i) {
        const LkAsyncCopy& copy = self->async[i];
        if (in_flight < 0 || copy.group + (unsigned)in_flight < self->async_committed) lk_land(copy);
        else self->async[kept++] = copy;
    }
    self->async_pending = kept;
}
inline LkThread* lk_self() {
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    return (LkThread*)(sp & ~(uintptr_t)(LK_STACK_BYTES - 1));
}
#define threadIdx (lk_self()->thread_idx)
#define blockIdx (lk_self()->block_idx)
#define blockDim (lk_self()->block_dim)
#define gridDim (lk_self()->grid_dim)

// Waits until every live thread of the block has arrived (a fiber switch).
void __syncthreads();
// Waits until every live thread of the calling warp has arrived.
void lk_warp_sync();
inline unsigned lk_lane() { return lk_self()->lane; }
inline uint32_t* lk_warp_words() { return lk_self()->warp_words; }
inline uint32_t* lk_slot(uint32_t* words, unsigned lane, unsigned word) { return words + lane * LK_WARP_WORDS + word; }

inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline float __int_as_float(int i) {
    float x;
    memcpy(&x, &i, 4);
    return x;
}
// Built with -ffp-contract=off: a product or sum is rounded once, as these intrinsics promise.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// CUDA's min and max: integers in their common type, floats as fminf / fmaxf do.
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return fminf((float)a, (float)b);
    else return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return fmaxf((float)a, (float)b);
    else return (C)a < (C)b ? (C)b : (C)a;
}

// Fibers never preempt one another, so a read-modify-write is atomic here.
template <typename T> inline T atomicMin(T* address, T value) {
    T old = *address;
    if (value < old) *address = value;
    return old;
}

inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask, int /*width*/ = 32) {
    unsigned lane = lk_lane();
    uint32_t* words = lk_warp_words();
    *lk_slot(words, lane, 0) = __float_as_uint(value);
    lk_warp_sync();
    float other = __uint_as_float(*lk_slot(words, lane ^ (unsigned)lane_mask, 0));
    lk_warp_sync();
    return other;
}

// f16 <-> f32 with round-to-nearest-even (the prelude's cvt instructions).
inline float lk_half_to_float(uint16_t bits) {
    _Float16 h;
    memcpy(&h, &bits, 2);
    return (float)h;
}
inline uint16_t lk_float_to_half(float x) {
    _Float16 h = (_Float16)x;
    uint16_t bits;
    memcpy(&bits, &h, 2);
    return bits;
}
