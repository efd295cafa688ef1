// lk_switch and lk_fiber_start (fiber_switch.h) for x86-64 System V.
#include "fiber_switch.h"

asm(R"(
    .text
    .globl lk_switch
    .type lk_switch, @function
lk_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lk_switch, .-lk_switch

    .globl lk_fiber_start
    .type lk_fiber_start, @function
lk_fiber_start:
    # Entered by lk_switch's ret with %rsp 16-byte aligned; the entry point sits 8 bytes up.
    movq 8(%rsp), %rax
    call *%rax
    ud2
    .size lk_fiber_start, .-lk_fiber_start
)");
