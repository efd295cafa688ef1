// Switching between fibers on one OS thread. swapcontext saves the signal mask with a system
// call on every switch; the emulator switches at every barrier and warp exchange, so on x86-64
// it saves only the callee-saved registers and the stack pointer (the System V ABI's contract
// for a call). Written for x86-64 alone: elsewhere the build reports the emulator unavailable
// and the CUDA tests say they were skipped.
#pragma once

#if defined(__x86_64__)

// Saves the callee-saved registers on the current stack, stores the stack pointer in *save,
// and resumes the stack `load` (one made by lk_fiber_stack, or saved by an earlier switch).
extern "C" void lk_switch(void** save, void* load);

// A stack for `entry` ending at `top` (16-byte aligned), ready for lk_switch to resume: six
// zero registers, then lk_fiber_start's address, which calls `entry` with the stack aligned.
inline void* lk_fiber_stack(char* top, void (*entry)()) {
    void** sp = reinterpret_cast<void**>(top);
    sp[-1] = reinterpret_cast<void*>(entry);  // read by lk_fiber_start from its own frame
    extern char lk_fiber_start[];
    sp[-3] = lk_fiber_start;                  // the address lk_switch's `ret` lands on
    for (int i = 4; i <= 9; ++i) sp[-i] = nullptr;
    return sp - 9;
}

#else
#error "the CUDA emulator's fibers are written for x86-64"
#endif
