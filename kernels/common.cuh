// Shared device helpers for andrea's kernels (included by every kernels/*.cu).
//
// Conventions, the same in every file:
//   * Pointers arrive already offset to the first element of their view; the host
//     (crates/andrea-cuda/src/plan) has validated every shape, bound and alias, and
//     chooses grid, block, shared memory and the vector width.
//   * Sizes that can exceed 2^31 elements in total are `long long`; row lengths and
//     row counts that the host bounds to < 2^31 are `int`, but every address is formed
//     in 64-bit arithmetic.
//   * Reductions add in an order fixed by the sizes (warp shuffle trees, fixed chunks),
//     never by the schedule: results are bit-identical from run to run.
#pragma once

#define ANDREA_FULL_MASK 0xffffffffu

// sqrt(2/pi) and the cubic coefficient of the tanh form of GELU.
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

// tanh on the special function unit: one MUFU instruction, max relative error about
// 2^-11 (PTX ISA, `tanh.approx.f32`, sm_75+). Used by the fast GELU variants only; the
// exact variants use libdevice's tanhf (about 2 ulp).
__device__ __forceinline__ float tanh_approx(float x) {
#ifdef ANDREA_CUDA_EMU
    return emu_tanh_approx(x);  // the CPU emulator (xtask/cuda-emu) models the instruction
#else
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

template <bool APPROX>
__device__ __forceinline__ float tanh_f(float x) {
    return APPROX ? tanh_approx(x) : tanhf(x);
}

// GELU, tanh form: 0.5·x·(1 + tanh(k0·(x + k1·x³))).
template <bool APPROX>
__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K0 * (x + GELU_K1 * x * x * x);
    return 0.5f * x * (1.0f + tanh_f<APPROX>(u));
}

// d GELU / dx = 0.5·(1 + t) + 0.5·x·(1 - t²)·k0·(1 + 3·k1·x²), t = tanh(u).
template <bool APPROX>
__device__ __forceinline__ float gelu_grad_f(float x) {
    float x2 = x * x;
    float u = GELU_K0 * (x + GELU_K1 * x2 * x);
    float t = tanh_f<APPROX>(u);
    float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x2);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ANDREA_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(ANDREA_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(ANDREA_FULL_MASK, v, o));
    return v;
}

// Online-softmax pair (running max m, running sum s of exp(x - m)), merged across lanes.
// An empty side has m = -inf and s = 0.
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    if (mn == -INFINITY) return;
    s = s * expf(m - mn) + s2 * expf(m2 - mn);
    m = mn;
}

__device__ __forceinline__ void warp_online_merge(float& m, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(ANDREA_FULL_MASK, m, o);
        float s2 = __shfl_xor_sync(ANDREA_FULL_MASK, s, o);
        online_merge(m, s, m2, s2);
    }
}

// Grid-stride loop over [0, n).
#define GRID_STRIDE(i, n)                                                          \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)
