// The device side of andrea's CUDA emulator: what kernels/*.cu need from CUDA, modelled
// on the CPU, so that the same sources compile as C++ (with -DANDREA_CUDA_EMU) into a
// libcuda.so.1 that runs them (see emu_runtime.cpp and `cargo xtask cuda-emu`).
//
// Threads of a block are fibers on one OS thread, switched only at barriers
// (__syncthreads, __syncwarp) and warp shuffles, which are modelled as exchanges through
// a per-warp slot array between two warp barriers. Shared memory is `static
// thread_local` (blocks of one launch run one after another). WMMA fragments are whole
// tiles held by lane 0, which does each warp-collective operation for its warp; TF32
// and BF16 rounding are modelled bit-exactly (round to nearest, ties away for TF32 as
// cvt.rna; ties to even for BF16). tanh.approx.f32 is tanhf rounded to 11 significant
// bits, about the instruction's documented error.
//
// The tensor-core and async-copy wrappers of kernels/common.cuh (mma.sync bf16/tf32,
// ldmatrix, cp.async, cvt) are modelled lane by lane in emu_runtime.cpp: mma and
// ldmatrix as warp collectives over the PTX ISA's per-lane fragment layouts (all 32
// lanes must enter together), cp.async copies landing only at the issuing thread's
// cp_async_wait; misuse (a misaligned or non-shared ldmatrix row, an uncommitted or
// still-in-flight copy at exit, a wait with no commit) fails the launch with a message
// naming the kernel.
//
// What it cannot show: races between real concurrent threads, memory-model issues,
// performance. What it does show: argument order, launch shapes, index arithmetic,
// barrier structure, out-of-bounds writes (canaries) and reads past a buffer (guard
// pages).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

struct dim3 {
    unsigned x, y, z;
};

const dim3& emu_thread_idx();
const dim3& emu_block_idx();
const dim3& emu_block_dim();
const dim3& emu_grid_dim();
void emu_sync_block();
void emu_sync_warp();
uint64_t emu_exchange(uint64_t value, int src_lane);
float* emu_dynamic_smem();
float emu_tanh_approx(float x);

#define threadIdx (emu_thread_idx())
#define blockIdx (emu_block_idx())
#define blockDim (emu_block_dim())
#define gridDim (emu_grid_dim())

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __syncthreads() emu_sync_block()

inline void __syncwarp(unsigned = 0xffffffffu) { emu_sync_warp(); }

inline int emu_lane() { return (int)(emu_thread_idx().x & 31u); }

template <class T>
inline T emu_shfl(T v, int src) {
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    b = emu_exchange(b, src & 31);
    T r;
    std::memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_shfl(v, emu_lane() ^ o);
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
    return emu_shfl(v, src);
}

using std::max;
using std::min;

struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }

// ---- bf16 and WMMA ------------------------------------------------------------------

struct __nv_bfloat16 {
    uint16_t bits;
    operator float() const {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);  // nearest, ties to even
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}
enum layout_t { mem_row_major, mem_col_major };

inline float __float_to_tf32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;  // nearest, ties away
    std::memcpy(&f, &u, 4);
    return f;
}

template <class Use, int M, int N, int K, class T, class L = void>
struct fragment;
template <int M, int N, int K, class T, class L>
struct fragment<matrix_a, M, N, K, T, L> {
    float x[M * K];
};
template <int M, int N, int K, class T, class L>
struct fragment<matrix_b, M, N, K, T, L> {
    float x[K * N];
};
template <int M, int N, int K, class T>
struct fragment<accumulator, M, N, K, T, void> {
    float x[M * N];
};

template <int M, int N, int K, class T>
inline void fill_fragment(fragment<accumulator, M, N, K, T>& f, float v) {
    if (emu_lane() == 0)
        for (float& e : f.x) e = v;
}
template <int M, int N, int K, class T, class E>
inline void load_matrix_sync(fragment<matrix_a, M, N, K, T, row_major>& f, const E* p, unsigned ldm) {
    if (emu_lane() == 0)
        for (int r = 0; r < M; ++r)
            for (int k = 0; k < K; ++k) f.x[r * K + k] = (float)p[r * ldm + k];
}
template <int M, int N, int K, class T, class E>
inline void load_matrix_sync(fragment<matrix_b, M, N, K, T, row_major>& f, const E* p, unsigned ldm) {
    if (emu_lane() == 0)
        for (int k = 0; k < K; ++k)
            for (int c = 0; c < N; ++c) f.x[k * N + c] = (float)p[k * ldm + c];
}
template <int M, int N, int K, class T, class TA, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, T>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, T>& c) {
    if (emu_lane() != 0) return;
    float out[M * N];
    for (int r = 0; r < M; ++r)
        for (int col = 0; col < N; ++col) {
            float s = c.x[r * N + col];
            for (int k = 0; k < K; ++k) s = fmaf(a.x[r * K + k], b.x[k * N + col], s);
            out[r * N + col] = s;
        }
    std::memcpy(d.x, out, sizeof(out));
}
template <int M, int N, int K, class T>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t) {
    if (emu_lane() == 0)
        for (int r = 0; r < M; ++r)
            for (int c = 0; c < N; ++c) p[r * ldm + c] = f.x[r * N + c];
    emu_sync_warp();
}
}  // namespace wmma
}  // namespace nvcuda
