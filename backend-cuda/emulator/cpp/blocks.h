// Kernels by name, and running one over a grid (blocks.cpp).
#pragma once

#include <stdint.h>

namespace lk {

// Runs one CUDA thread of a kernel with its parameters (cuLaunchKernel's kernelParams).
using ThreadBody = void (*)(void** params);

// Registers `name` (one per kernel entry point; generated beside each kernel file).
struct Registration {
    Registration(const char* name, ThreadBody body);
};

// The kernel registered as `name`, or null.
ThreadBody find_kernel(const char* name);

// Runs `body` over the grid, block after block; false (after printing why) when the threads
// of a block cannot all make progress (a barrier some of them never reach).
bool run_grid(const char* name, ThreadBody body, void** params, const unsigned grid[3], const unsigned block[3]);

}  // namespace lk
