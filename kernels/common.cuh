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

// ---- Tensor-core and asynchronous-copy wrappers ------------------------------------
//
// Every GPU-only instruction a kernel uses goes through one of these: inline PTX for
// nvcc, and for the CPU emulator (xtask/cuda-emu/emu.h) a warp collective that follows
// the PTX ISA's per-lane semantics exactly, so a fragment-layout bug fails on this
// machine rather than for the first time on a GPU.
//
// Lane l of a warp is "group" g = l / 4 and "thread in group" t = l % 4 in the layouts
// below (PTX ISA, "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8"). A is row-major
// 16 x K, B is column-major K x 8, C and D are 16 x 8 FP32:
//
//   mma_bf16_m16n8k16: a[i] packs two BF16 (lower half = lower column):
//       a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//       a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//     b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   mma_tf32_m16n8k8: a[0] = A[g][t]  a[1] = A[g+8][t]  a[2] = A[g][t+4]  a[3] = A[g+8][t+4]
//     b[0] = B[t][g]   b[1] = B[t+4][g]
//   both: c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]
//
// ldmatrix_xN: lanes 8i..8i+7 give the row addresses (16 bytes each, in shared memory)
// of 8 x 8 b16 matrix i; lane l receives in r[i] the two elements of row l / 4, columns
// 2(l % 4) and 2(l % 4) + 1 of matrix i (with .trans, of its transpose). For x1 and x2
// only lanes 0-7 / 0-15 supply addresses (the others' are ignored).
//
// cp_async_16 / cp_async_4 copy 16 / 4 bytes from global to shared memory asynchronously;
// `src_bytes` < the size zero-fills the rest (0: no global read at all, for masked
// tiles). The copies a thread issued become visible only when that thread's
// cp_async_wait<N>() has retired their group (all but the N most recent committed
// groups); a read before that sees whatever the shared memory held before.

#ifdef ANDREA_CUDA_EMU
void emu_mma_bf16_m16n8k16(float* d, const unsigned* a, const unsigned* b, const float* c);
void emu_mma_tf32_m16n8k8(float* d, const unsigned* a, const unsigned* b, const float* c);
void emu_ldmatrix(unsigned* r, int count, bool trans, const void* row_addr);
void emu_cp_async(void* smem, const void* gmem, int bytes, int src_bytes);
void emu_cp_async_commit();
void emu_cp_async_wait(int pending);
unsigned emu_f32_to_tf32(float x);
unsigned emu_pack_bf16x2(float lo, float hi);
#endif

// D = A·B + C, BF16 operands, FP32 accumulate (mma.sync.aligned.m16n8k16.row.col).
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const unsigned (&a)[4],
                                                  const unsigned (&b)[2], const float (&c)[4]) {
#ifdef ANDREA_CUDA_EMU
    emu_mma_bf16_m16n8k16(d, a, b, c);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
#endif
}

// D = A·B + C, TF32 operands, FP32 accumulate (mma.sync.aligned.m16n8k8.row.col).
__device__ __forceinline__ void mma_tf32_m16n8k8(float (&d)[4], const unsigned (&a)[4],
                                                 const unsigned (&b)[2], const float (&c)[4]) {
#ifdef ANDREA_CUDA_EMU
    emu_mma_tf32_m16n8k8(d, a, b, c);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
#endif
}

#ifndef ANDREA_CUDA_EMU
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
#endif

// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16; `row_addr` is this lane's row.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row_addr) {
#ifdef ANDREA_CUDA_EMU
    emu_ldmatrix(r, 4, false, row_addr);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row_addr)));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row_addr) {
#ifdef ANDREA_CUDA_EMU
    emu_ldmatrix(r, 4, true, row_addr);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(row_addr)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* row_addr) {
#ifdef ANDREA_CUDA_EMU
    emu_ldmatrix(r, 2, false, row_addr);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(row_addr)));
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], const void* row_addr) {
#ifdef ANDREA_CUDA_EMU
    emu_ldmatrix(r, 2, true, row_addr);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(row_addr)));
#endif
}

// cp.async.cg (16 bytes, L2 only) and cp.async.ca (4 bytes) with zero-fill.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes = 16) {
#ifdef ANDREA_CUDA_EMU
    emu_cp_async(smem, gmem, 16, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes = 4) {
#ifdef ANDREA_CUDA_EMU
    emu_cp_async(smem, gmem, 4, src_bytes);
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
                 "r"(src_bytes));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef ANDREA_CUDA_EMU
    emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef ANDREA_CUDA_EMU
    emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// FP32 -> TF32 (cvt.rna: nearest, ties away), as the b32 register an mma operand takes.
__device__ __forceinline__ unsigned f32_to_tf32(float x) {
#ifdef ANDREA_CUDA_EMU
    return emu_f32_to_tf32(x);
#else
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#endif
}

// One FP32 -> BF16 (nearest, ties to even; NaN stays NaN), as its 16 bits.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
#ifdef ANDREA_CUDA_EMU
    return (unsigned short)(emu_pack_bf16x2(x, 0.0f) & 0xffffu);
#else
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
#endif
}

// BF16 bits -> FP32 (exact).
__device__ __forceinline__ float bf16_to_float(unsigned short b) {
    unsigned u = (unsigned)b << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

// Two FP32 -> one b32 of two BF16 (nearest, ties to even); `lo` in the lower half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
#ifdef ANDREA_CUDA_EMU
    return emu_pack_bf16x2(lo, hi);
#else
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}
