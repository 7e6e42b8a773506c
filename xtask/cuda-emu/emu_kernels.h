// The emulator's kernel table: one entry per kernel, with a trampoline that unpacks the
// driver's `void** params` into the kernel's own parameter types.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

struct EmuKernel {
    const char* name;
    void* fn;
    void (*invoke)(void* fn, void** params);
    // What ptxas compiles the kernel to for sm_80 (crates/andrea-cuda/ptx/resources.tsv),
    // reported by cuFuncGetAttribute as a driver would.
    int registers;
    int static_smem;
};

template <class... A, std::size_t... I>
void emu_invoke_impl(void (*f)(A...), void** p, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(p[I])...);
}

template <class... A>
void emu_invoke(void* f, void** p) {
    emu_invoke_impl(reinterpret_cast<void (*)(A...)>(f), p, std::index_sequence_for<A...>{});
}

template <class... A>
EmuKernel emu_entry(const char* name, void (*f)(A...), int registers, int static_smem) {
    return EmuKernel{name, reinterpret_cast<void*>(f), &emu_invoke<A...>, registers, static_smem};
}

extern "C" const EmuKernel* emu_kernel_table(int* n);
