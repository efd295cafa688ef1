// cp.async (global to shared memory, landed once a wait_group covers its commit group) as
// attention.cu uses it. Whether a copy lands when it is issued or only when a wait needs it
// alternates from block to block (every other pair of blocks), and blocks.cpp alternates the
// threads' order too, so a kernel that reads a tile before waiting for it, or refills a buffer
// that other threads still read, gets wrong results in some blocks, and its results show it.
// Included after kernel_dialect.h; the kernel files skip their inline PTX when
// LOCKSTEP_EMULATED is defined.
#pragma once

#include <stdio.h>

inline void lk_copy_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
    LkThread* self = lk_self();
    const LkAsyncCopy copy{dst, src, bytes, src_bytes, self->async_committed};
    const lk::uint3 b = self->block_idx;
    const bool at_issue = (b.x + b.y + b.z) / 2 % 2 == 1;
    if (at_issue || self->async_pending == LK_ASYNC_COPIES) {
        lk_land(copy);
    } else {
        self->async[self->async_pending++] = copy;
    }
}
inline void copy_async_16(void* dst, const void* src, unsigned src_bytes) { lk_copy_async(dst, src, 16, src_bytes); }
inline void copy_async_8(void* dst, const void* src, unsigned src_bytes) { lk_copy_async(dst, src, 8, src_bytes); }
inline void copy_async_commit() { ++lk_self()->async_committed; }
// Lands the copies of every committed group but the newest N.
template <int N> inline void copy_async_wait() { lk_land_copies(lk_self(), N); }
