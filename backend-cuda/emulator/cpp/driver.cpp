// The CUDA driver API the backend reaches through cudarc, on the CPU: LOCKSTEP_CUDA_EMULATOR_DEVICES
// devices (2 by default, so multi-GPU paths run), each with its own primary context and memory
// from the process's pages (a device pointer is a host address), every stream synchronous (work
// runs when it is queued, on the queuing thread), kernels from the registry of host-compiled
// kernel files (blocks.cpp). Modules ignore the CUBIN NVRTC made and look entry points up by
// name. As on a GPU, a thread has no current context until it binds one: memory, streams and
// modules asked for without one fail (CUDA_ERROR_INVALID_CONTEXT).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "blocks.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUmodule;
typedef void* CUmemoryPool;

namespace {

enum : CUresult {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    NOT_FOUND = 500,
    NOT_SUPPORTED = 801,
    LAUNCH_FAILED = 719,
};

struct Event {
    double seconds = 0.0;
};
struct Function {
    const char* name;
    lk::ThreadBody body;
};

double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Device memory: pages of the process, counted per device against a capacity
// (LOCKSTEP_CUDA_EMULATOR_MEMORY, bytes per device; 8 GiB by default) so out-of-memory paths can
// be reached. Each allocation ends (after
// rounding to 256 bytes, the kernels' widest alignment) at an inaccessible page, so a kernel
// that writes or reads past a buffer's end stops the process instead of corrupting another.
struct Mapping {
    size_t bytes;    // as asked
    char* base;      // of the mapping, guard page included
    size_t mapped;
    int device;
};
constexpr int MAX_DEVICES = 8;
struct Memory {
    std::mutex lock;
    std::map<CUdeviceptr, Mapping> blocks;
    size_t used[MAX_DEVICES] = {};
    size_t capacity = 0;
};
Memory& memory() {
    static Memory* m = [] {
        auto* m = new Memory;
        const char* text = getenv("LOCKSTEP_CUDA_EMULATOR_MEMORY");
        m->capacity = text ? strtoull(text, nullptr, 10) : (8ull << 30);
        return m;
    }();
    return *m;
}

int device_count() {
    static const int count = [] {
        const char* text = getenv("LOCKSTEP_CUDA_EMULATOR_DEVICES");
        int n = text ? atoi(text) : 2;
        return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
    }();
    return count;
}

// A device's primary context is the address of its slot here; the calling thread's current one
// is null until it sets one.
char primary_contexts[MAX_DEVICES];
thread_local CUcontext current = nullptr;
int current_device() { return current ? (int)(static_cast<char*>(current) - primary_contexts) : -1; }

char a_stream, a_module;

}  // namespace

extern "C" {

CUresult cuInit(unsigned) { return SUCCESS; }
CUresult cuDriverGetVersion(int* version) {
    *version = 13000;
    return SUCCESS;
}
CUresult cuDeviceGetCount(int* count) {
    *count = device_count();
    return SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (ordinal < 0 || ordinal >= device_count()) return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    snprintf(name, (size_t)len, "Lockstep CUDA emulator (CPU)");
    return SUCCESS;
}
CUresult cuDeviceGetUuid(char uuid[16], CUdevice device) {
    memset(uuid, 0x4c, 16);
    uuid[15] = (char)device;
    return SUCCESS;
}
CUresult cuDeviceGetUuid_v2(char uuid[16], CUdevice device) { return cuDeviceGetUuid(uuid, device); }
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    *bytes = memory().capacity;
    return SUCCESS;
}
// An sm_90 part with one multiprocessor (grids stay small), no memory pools (the backend's
// synchronous allocator), Hopper's shared-memory limits.
CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice) {
    switch (attribute) {
    case 1: *value = 1024; break;            // max threads per block
    case 8: *value = 48 * 1024; break;       // shared memory per block
    case 10: *value = 32; break;             // warp size
    case 16: *value = 1; break;              // multiprocessors
    case 19: *value = 1; break;              // can map host memory
    case 41: *value = 1; break;              // unified addressing
    case 75: *value = 9; break;              // compute capability major
    case 76: *value = 0; break;              // minor
    case 97: *value = 227 * 1024; break;     // opt-in shared memory per block
    case 115: *value = 0; break;             // memory pools
    default: *value = 0; break;
    }
    return SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
    if (device < 0 || device >= device_count()) return INVALID_DEVICE;
    *context = &primary_contexts[device];
    return SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext context) {
    current = context;
    return SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* context) {
    *context = current;
    return SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* device) {
    if (!current) return INVALID_CONTEXT;
    *device = current_device();
    return SUCCESS;
}
CUresult cuCtxSynchronize() { return SUCCESS; }
CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    *least = 0;
    *greatest = 0;
    return SUCCESS;
}

CUresult cuStreamCreate(CUstream* stream, unsigned) {
    if (!current) return INVALID_CONTEXT;
    *stream = &a_stream;
    return SUCCESS;
}
CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned flags, int) { return cuStreamCreate(stream, flags); }
CUresult cuStreamDestroy_v2(CUstream) { return SUCCESS; }
CUresult cuStreamSynchronize(CUstream) { return SUCCESS; }
CUresult cuStreamQuery(CUstream) { return SUCCESS; }
CUresult cuStreamWaitEvent(CUstream, void*, unsigned) { return SUCCESS; }
CUresult cuLaunchHostFunc(CUstream, void (*fn)(void*), void* data) {
    fn(data);
    return SUCCESS;
}

CUresult cuEventCreate(void** event, unsigned) {
    *event = new Event;
    return SUCCESS;
}
CUresult cuEventDestroy_v2(void* event) {
    delete static_cast<Event*>(event);
    return SUCCESS;
}
CUresult cuEventRecord(void* event, CUstream) {
    static_cast<Event*>(event)->seconds = now();
    return SUCCESS;
}
CUresult cuEventRecordWithFlags(void* event, CUstream stream, unsigned) { return cuEventRecord(event, stream); }
CUresult cuEventSynchronize(void*) { return SUCCESS; }
CUresult cuEventQuery(void*) { return SUCCESS; }
CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
    *ms = (float)((static_cast<Event*>(end)->seconds - static_cast<Event*>(start)->seconds) * 1e3);
    return SUCCESS;
}
CUresult cuEventElapsedTime_v2(float* ms, void* start, void* end) { return cuEventElapsedTime(ms, start, end); }

// Fresh memory reads as all-ones bytes (NaN in every float type), so a kernel that reads what
// nobody wrote shows it.
CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    const int device = current_device();
    if (device < 0) return INVALID_CONTEXT;
    if (bytes == 0) return INVALID_VALUE;
    if (m.used[device] + bytes > m.capacity) return OUT_OF_MEMORY;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t usable = (bytes + 255) / 256 * 256;
    size_t mapped = (usable + page - 1) / page * page + page;
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return OUT_OF_MEMORY;
    char* guard_page = static_cast<char*>(base) + mapped - page;
    mprotect(guard_page, page, PROT_NONE);
    char* p = guard_page - usable;
    memset(p, 0xff, usable);
    *ptr = (CUdeviceptr)(uintptr_t)p;
    m.blocks[*ptr] = Mapping{bytes, static_cast<char*>(base), mapped, device};
    m.used[device] += bytes;
    return SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.blocks.find(ptr);
    if (it == m.blocks.end()) return INVALID_VALUE;
    m.used[it->second.device] -= it->second.bytes;
    munmap(it->second.base, it->second.mapped);
    m.blocks.erase(it);
    return SUCCESS;
}
CUresult cuMemAllocAsync(CUdeviceptr* ptr, size_t bytes, CUstream) { return cuMemAlloc_v2(ptr, bytes); }
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream) { return cuMemFree_v2(ptr); }
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    const int device = current_device();
    if (device < 0) return INVALID_CONTEXT;
    *free_bytes = m.capacity - m.used[device];
    *total = m.capacity;
    return SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool*, CUdevice) { return NOT_SUPPORTED; }

CUresult cuMemHostAlloc(void** ptr, size_t bytes, unsigned) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? SUCCESS : OUT_OF_MEMORY;
}
CUresult cuMemAllocHost_v2(void** ptr, size_t bytes) { return cuMemHostAlloc(ptr, bytes, 0); }
CUresult cuMemFreeHost(void* ptr) {
    free(ptr);
    return SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    memcpy((void*)(uintptr_t)dst, src, bytes);
    return SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
    return cuMemcpyHtoD_v2(dst, src, bytes);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (const void*)(uintptr_t)src, bytes);
    return SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
    return cuMemcpyDtoH_v2(dst, src, bytes);
}
// memmove: the backend stages overlapping copies itself, but a copy must not depend on that.
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
    return SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    memset((void*)(uintptr_t)dst, value, n);
    return SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream) {
    return cuMemsetD8_v2(dst, value, n);
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, CUstream) {
    auto* words = (unsigned*)(uintptr_t)dst;
    for (size_t i = 0; i < n; ++i) words[i] = value;
    return SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void*) {
    if (!current) return INVALID_CONTEXT;
    *module = &a_module;
    return SUCCESS;
}
CUresult cuModuleUnload(CUmodule) { return SUCCESS; }
CUresult cuModuleGetFunction(void** function, CUmodule, const char* name) {
    lk::ThreadBody body = lk::find_kernel(name);
    if (!body) return NOT_FOUND;
    *function = new Function{strdup(name), body};
    return SUCCESS;
}
CUresult cuFuncGetAttribute(int* value, int attribute, void*) {
    *value = attribute == 0 ? 1024 : 0;  // max threads per block; no registers or local memory counted
    return SUCCESS;
}
CUresult cuFuncSetAttribute(void*, int, int) { return SUCCESS; }
CUresult cuFuncSetCacheConfig(void*, int) { return SUCCESS; }

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned /*shared bytes*/, CUstream, void** params, void** extra) {
    auto* function = static_cast<Function*>(f);
    if (extra != nullptr) return INVALID_VALUE;
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return lk::run_grid(function->name, function->body, params, grid, block) ? SUCCESS : LAUNCH_FAILED;
}

CUresult cuGetErrorName(CUresult error, const char** name) {
    switch (error) {
    case SUCCESS: *name = "CUDA_SUCCESS"; break;
    case INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; return INVALID_VALUE;
    }
    return SUCCESS;
}
CUresult cuGetErrorString(CUresult error, const char** text) { return cuGetErrorName(error, text); }

}  // extern "C"
