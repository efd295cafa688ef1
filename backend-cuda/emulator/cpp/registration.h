// Included at the end of each generated kernel translation unit: LK_KERNEL(name) registers an
// entry point, unpacking cuLaunchKernel's parameter pointers into the kernel's own types.
#pragma once

#include <type_traits>
#include <utility>

#include "blocks.h"

namespace lk {
template <typename... A, size_t... I>
inline void call_unpacked(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(params[I])...);
}
template <typename... A> inline void call_with(void (*kernel)(A...), void** params) {
    call_unpacked(kernel, params, std::index_sequence_for<A...>{});
}
}  // namespace lk

#define LK_KERNEL(name) \
    static lk::Registration lk_registration_##name(#name, [](void** params) { lk::call_with(&name, params); });
