// The emulator's kernel execution: each block's threads are fibers of the launching OS thread
// (fiber_switch.h), each run until it finishes or waits at a barrier; a block barrier opens when
// every unfinished thread of the block waits at one, a warp barrier when every unfinished thread
// of that warp does. Even blocks run their threads first to last, odd blocks last to first, so a
// kernel that reads another thread's write without a barrier between them sees it in some
// blocks and not in others, and its results show it. Blocks run one after another, so static shared
// memory (thread_local statics) belongs to the running block.
#include "blocks.h"

#include <stdio.h>
#include <sys/mman.h>

#include <map>
#include <string>
#include <vector>

#include "fiber_switch.h"
#include "kernel_dialect.h"

namespace lk {
namespace {

std::map<std::string, ThreadBody>& registry() {
    static std::map<std::string, ThreadBody> kernels;
    return kernels;
}

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

constexpr unsigned MAX_THREADS = 1024;

struct Block;

struct Fiber {
    LkThread* self = nullptr;  // the bottom of its stack
    void* sp = nullptr;        // saved stack pointer while switched out
    State state = State::Done;
};

struct Block {
    void* scheduler_sp = nullptr;
    std::vector<Fiber> fibers;
    std::vector<uint32_t> warp_words;  // [warp][lane][LK_WARP_WORDS]
    ThreadBody body = nullptr;
    void** params = nullptr;
};

Fiber& fiber_of(LkThread* self) {
    Block* block = static_cast<Block*>(self->block);
    unsigned linear = self->thread_idx.x +
                      self->block_dim.x * (self->thread_idx.y + self->block_dim.y * self->thread_idx.z);
    return block->fibers[linear];
}

// A fiber's whole life: the thread's body, then back to the scheduler for good.
[[noreturn]] void fiber_main() {
    LkThread* self = lk_self();
    Block* block = static_cast<Block*>(self->block);
    block->body(block->params);
    lk_land_copies(self, -1);  // a thread's copies complete even if it never waits for them
    Fiber& fiber = fiber_of(self);
    fiber.state = State::Done;
    lk_switch(&fiber.sp, block->scheduler_sp);
    __builtin_unreachable();
}

// Switches from the calling fiber back to the scheduler, leaving it in `state`.
void wait_as(State state) {
    LkThread* self = lk_self();
    Fiber& fiber = fiber_of(self);
    fiber.state = state;
    lk_switch(&fiber.sp, static_cast<Block*>(self->block)->scheduler_sp);
}

// Opens the barriers every unfinished thread of their group waits at; true if any opened.
bool open_barriers(Block& block) {
    unsigned live = 0, at_block = 0;
    for (const Fiber& f : block.fibers) {
        live += f.state != State::Done;
        at_block += f.state == State::AtBlockBarrier;
    }
    if (live > 0 && at_block == live) {
        for (Fiber& f : block.fibers) f.state = State::Ready;
        return true;
    }
    bool opened = false;
    for (size_t warp = 0; warp * 32 < block.fibers.size(); ++warp) {
        size_t end = std::min(block.fibers.size(), warp * 32 + 32);
        unsigned warp_live = 0, waiting = 0;
        for (size_t i = warp * 32; i < end; ++i) {
            warp_live += block.fibers[i].state != State::Done;
            waiting += block.fibers[i].state == State::AtWarpBarrier;
        }
        if (warp_live > 0 && waiting == warp_live) {
            for (size_t i = warp * 32; i < end; ++i)
                if (block.fibers[i].state == State::AtWarpBarrier) block.fibers[i].state = State::Ready;
            opened = true;
        }
    }
    return opened;
}

bool run_block(Block& block, const char* name, uint3 block_idx) {
    for (Fiber& f : block.fibers) {
        f.state = State::Ready;
        f.self->block_idx = block_idx;
        f.self->async_committed = f.self->async_pending = 0;
        f.sp = lk_fiber_stack(reinterpret_cast<char*>(f.self) + LK_STACK_BYTES, fiber_main);
    }
    const size_t n = block.fibers.size();
    const bool backwards = (block_idx.x + block_idx.y + block_idx.z) % 2 == 1;
    for (;;) {
        bool ran = false;
        for (size_t i = 0; i < n; ++i) {
            Fiber& f = block.fibers[backwards ? n - 1 - i : i];
            if (f.state != State::Ready) continue;
            lk_switch(&block.scheduler_sp, f.sp);
            ran = true;
        }
        bool done = true;
        for (const Fiber& f : block.fibers) done &= f.state == State::Done;
        if (done) return true;
        if (!open_barriers(block) && !ran) {
            fprintf(stderr,
                    "lockstep CUDA emulator: kernel %s, block (%u, %u, %u): its threads wait at barriers "
                    "that not all of them reach\n",
                    name, block_idx.x, block_idx.y, block_idx.z);
            return false;
        }
    }
}

// Each OS thread keeps its fibers' stacks (aligned to their length) from one launch to the next.
thread_local std::vector<LkThread*> stacks;

bool reserve_stacks(unsigned threads) {
    while (stacks.size() < threads) {
        // Twice the length, so an aligned stack lies inside; the rest stays reserved, unused.
        void* region = mmap(nullptr, 2 * LK_STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) return false;
        uintptr_t aligned = ((uintptr_t)region + LK_STACK_BYTES - 1) & ~(uintptr_t)(LK_STACK_BYTES - 1);
        stacks.push_back(reinterpret_cast<LkThread*>(aligned));
    }
    return true;
}

}  // namespace

Registration::Registration(const char* name, ThreadBody body) { registry()[name] = body; }

ThreadBody find_kernel(const char* name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : it->second;
}

bool run_grid(const char* name, ThreadBody body, void** params, const unsigned grid[3], const unsigned dims[3]) {
    unsigned threads = dims[0] * dims[1] * dims[2];
    if (threads == 0 || threads > MAX_THREADS || grid[0] * grid[1] * grid[2] == 0) {
        fprintf(stderr, "lockstep CUDA emulator: kernel %s launched with %u threads a block\n", name, threads);
        return false;
    }
    if (!reserve_stacks(threads)) return false;
    Block block;
    block.body = body;
    block.params = params;
    block.fibers.resize(threads);
    block.warp_words.assign((threads + 31) / 32 * 32 * LK_WARP_WORDS, 0);
    for (unsigned i = 0; i < threads; ++i) {
        LkThread* self = stacks[i];
        *self = LkThread{};
        self->thread_idx = uint3{i % dims[0], i / dims[0] % dims[1], i / (dims[0] * dims[1])};
        self->block_dim = uint3{dims[0], dims[1], dims[2]};
        self->grid_dim = uint3{grid[0], grid[1], grid[2]};
        self->lane = i % 32;
        self->warp_words = &block.warp_words[(size_t)(i / 32) * 32 * LK_WARP_WORDS];
        self->block = &block;
        block.fibers[i].self = self;
    }
    bool ok = true;
    for (unsigned z = 0; z < grid[2] && ok; ++z)
        for (unsigned y = 0; y < grid[1] && ok; ++y)
            for (unsigned x = 0; x < grid[0] && ok; ++x) ok = run_block(block, name, uint3{x, y, z});
    return ok;
}

}  // namespace lk

void __syncthreads() { lk::wait_as(lk::State::AtBlockBarrier); }

void lk_warp_sync() { lk::wait_as(lk::State::AtWarpBarrier); }
