// Batched strided matmul with fused epilogue:
//
//   C[b] = (accumulate ? C[b] : 0) + A[b]·B[b] + bias      A[b]: [M, K], B[b]: [K, N]
//   gelu_out[b] = GELU(C[b])         when gelu_mode is 1 (tanhf) or 2 (tanh.approx.f32)
//   C[b] ⊙= GELU'(gelu_in[b])        when gelu_mode is 3 (tanhf) or 4 (tanh.approx.f32)
//
// The epilogue and the argument list (MATMUL_PARAMS) are in matmul_epilogue.cuh.
// Element (b, i, j) of each operand is at b·bs + i·rs + j·cs: transposes are strides,
// and a broadcast operand has bs = 0. gelu_out and gelu_in have C's strides.
//
// Two kernels, chosen by plan::matmul from the shape and the backend's precision:
//
//   matmul_simt: FP32 FMA. Block 256 threads = 16×16, tile 64×64, K step 16; thread
//     (tx, ty) accumulates rows ty + 16·i and columns tx + 16·j (i, j < 4) so shared
//     reads are broadcasts or conflict-free. Grid (ceil(N/64), ceil(M/64), batch).
//   matmul_tc_tf32 / matmul_tc_bf16: tensor cores through WMMA, operands rounded to TF32
//     (10-bit mantissa) or BF16 (7-bit) when staged in shared memory, FP32 accumulate.
//     Block 256 = 8 warps as 4×2, tile 128×128, K step 32; each warp owns 32×64 =
//     2×4 fragments of 16×16. Grid (ceil(N/128), ceil(M/128), batch). The epilogue goes
//     through a 16×16 staging area per warp so bias, accumulate, GELU and the bounds
//     checks are done per element.
//
// Tiles are staged in shared memory by load_tile in one of four modes picked on the
// host: scalar with the column (0) or the row (1) index fastest, so that the operand's
// contiguous dimension is the one neighbouring threads walk; or 16-byte float4 loads
// along columns (2, needs cs = 1) or rows (3, needs rs = 1), which the host allows only
// when that dimension's size and every other stride are multiples of 4 and the base is
// 16-byte aligned. Out-of-range elements of edge tiles are staged as zeros and never
// stored.
//
// Not yet done (needs a GPU to measure): cp.async double buffering, and a wgmma path
// for sm_90a.
#ifndef ANDREA_CUDA_EMU  // the CPU emulator brings its own WMMA and bf16 models
#include <cuda_bf16.h>
#include <mma.h>
#endif

#include "common.cuh"
#include "matmul_epilogue.cuh"

using namespace nvcuda;

template <int CVT>
struct Cvt;
template <>
struct Cvt<0> {  // plain FP32
    typedef float T;
    static __device__ __forceinline__ float f(float x) { return x; }
};
template <>
struct Cvt<1> {  // TF32, stored in a float
    typedef float T;
    static __device__ __forceinline__ float f(float x) { return wmma::__float_to_tf32(x); }
};
template <>
struct Cvt<2> {  // BF16
    typedef __nv_bfloat16 T;
    static __device__ __forceinline__ __nv_bfloat16 f(float x) { return __float2bfloat16(x); }
};

// Stages the ROWS×COLS tile whose element (r, c) is src[r·rs + c·cs] (valid for r < nr,
// c < nc; zeros elsewhere) into dst[r·LD + c].
template <int ROWS, int COLS, int LD, int NT, int CVT>
__device__ __forceinline__ void load_tile(typename Cvt<CVT>::T* dst, const float* src, int nr, int nc,
                                          long long rs, long long cs, int mode) {
    int tid = threadIdx.x;
    if (mode == 2) {
        for (int e = tid; e < ROWS * COLS / 4; e += NT) {
            int r = e / (COLS / 4), c = (e % (COLS / 4)) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < nr && c < nc) v = *reinterpret_cast<const float4*>(src + r * rs + c);
            typename Cvt<CVT>::T* d = dst + r * LD + c;
            d[0] = Cvt<CVT>::f(v.x);
            d[1] = Cvt<CVT>::f(v.y);
            d[2] = Cvt<CVT>::f(v.z);
            d[3] = Cvt<CVT>::f(v.w);
        }
    } else if (mode == 3) {
        for (int e = tid; e < ROWS * COLS / 4; e += NT) {
            int c = e / (ROWS / 4), r = (e % (ROWS / 4)) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < nr && c < nc) v = *reinterpret_cast<const float4*>(src + c * cs + r);
            dst[r * LD + c] = Cvt<CVT>::f(v.x);
            dst[(r + 1) * LD + c] = Cvt<CVT>::f(v.y);
            dst[(r + 2) * LD + c] = Cvt<CVT>::f(v.z);
            dst[(r + 3) * LD + c] = Cvt<CVT>::f(v.w);
        }
    } else if (mode == 0) {
        for (int e = tid; e < ROWS * COLS; e += NT) {
            int r = e / COLS, c = e % COLS;
            float v = (r < nr && c < nc) ? src[r * rs + c * cs] : 0.0f;
            dst[r * LD + c] = Cvt<CVT>::f(v);
        }
    } else {
        for (int e = tid; e < ROWS * COLS; e += NT) {
            int r = e % ROWS, c = e / ROWS;
            float v = (r < nr && c < nc) ? src[r * rs + c * cs] : 0.0f;
            dst[r * LD + c] = Cvt<CVT>::f(v);
        }
    }
}

// Split-K (k_slice > 0): blockIdx.z is the slice, not the batch entry, and slice s covers
// K indices [s·k_slice, min(K, (s+1)·k_slice)). The host passes a_bs = k_slice·a_cs,
// b_bs = k_slice·b_rs and C = the workspace with c_bs = M·N, c_rs = N, c_cs = 1, no bias,
// no accumulate, no GELU: each slice is this same kernel over its K range, writing a
// partial tile that matmul_splitk_reduce sums.
__device__ __forceinline__ int slice_k(int K, int k_slice) {
    return k_slice > 0 ? min(K - (int)blockIdx.z * k_slice, k_slice) : K;
}

// ---- FP32 SIMT -----------------------------------------------------------------------

#define S_BM 64
#define S_BN 64
#define S_BK 16
#define S_LDA (S_BK + 1)
#define S_LDB (S_BN + 4)

extern "C" __global__ void __launch_bounds__(256) matmul_simt(MATMUL_PARAMS) {
    __shared__ float As[S_BM * S_LDA];
    __shared__ float Bs[S_BK * S_LDB];
    K = slice_k(K, k_slice);
    int b = blockIdx.z;
    int m0 = blockIdx.y * S_BM, n0 = blockIdx.x * S_BN;
    const float* Ab = A + b * a_bs + m0 * a_rs;
    const float* Bb = B + b * b_bs + n0 * b_cs;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += S_BK) {
        load_tile<S_BM, S_BK, S_LDA, 256, 0>(As, Ab + k0 * a_cs, M - m0, K - k0, a_rs, a_cs, a_mode);
        load_tile<S_BK, S_BN, S_LDB, 256, 0>(Bs, Bb + k0 * b_rs, K - k0, N - n0, b_rs, b_cs, b_mode);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < S_BK; ++kk) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = As[(ty + 16 * i) * S_LDA + kk];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk * S_LDB + tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    Epilogue ep = Epilogue::at(C, gelu_out, gelu_in, bias, c_bs, c_rs, c_cs, accumulate, gelu_mode, b);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int r = m0 + ty + 16 * i, c = n0 + tx + 16 * j;
            if (r < M && c < N) ep.store(acc[i][j], r, c);
        }
}

// ---- tensor cores (WMMA) ----------------------------------------------------------------

#define T_BM 128
#define T_BN 128
#define T_BK 32

template <int CVT>
struct Tc;
template <>
struct Tc<1> {
    typedef wmma::precision::tf32 Frag;
    static const int WK = 8, PAD = 4;
};
template <>
struct Tc<2> {
    typedef __nv_bfloat16 Frag;
    static const int WK = 16, PAD = 8;
};

template <int CVT>
__device__ __forceinline__ void matmul_tc(MATMUL_PARAMS) {
    typedef typename Cvt<CVT>::T T;
    const int WK = Tc<CVT>::WK;
    const int LDA = T_BK + Tc<CVT>::PAD, LDB = T_BN + Tc<CVT>::PAD;
    const int A_BYTES = T_BM * LDA * sizeof(T), B_BYTES = T_BK * LDB * sizeof(T);
    __shared__ __align__(128) unsigned char smem[A_BYTES + B_BYTES];
    T* As = reinterpret_cast<T*>(smem);
    T* Bs = reinterpret_cast<T*>(smem + A_BYTES);

    K = slice_k(K, k_slice);
    int b = blockIdx.z;
    int m0 = blockIdx.y * T_BM, n0 = blockIdx.x * T_BN;
    const float* Ab = A + b * a_bs + m0 * a_rs;
    const float* Bb = B + b * b_bs + n0 * b_cs;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int wm = warp / 2, wn = warp % 2;  // warp tile rows wm·32.., columns wn·64..

    wmma::fragment<wmma::accumulator, 16, 16, Tc<CVT>::WK, float> acc[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += T_BK) {
        load_tile<T_BM, T_BK, LDA, 256, CVT>(As, Ab + k0 * a_cs, M - m0, K - k0, a_rs, a_cs, a_mode);
        load_tile<T_BK, T_BN, LDB, 256, CVT>(Bs, Bb + k0 * b_rs, K - k0, N - n0, b_rs, b_cs, b_mode);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < T_BK; kk += WK) {
            wmma::fragment<wmma::matrix_a, 16, 16, Tc<CVT>::WK, typename Tc<CVT>::Frag, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, Tc<CVT>::WK, typename Tc<CVT>::Frag, wmma::row_major> fb[4];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < 4; ++j) wmma::load_matrix_sync(fb[j], Bs + kk * LDB + wn * 64 + j * 16, LDB);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }

    // The staging areas reuse the A tile (8 warps × 256 floats = 8 KiB <= A_BYTES); the
    // last __syncthreads of the loop has retired every read of it.
    float* stage = reinterpret_cast<float*>(smem) + warp * 256;
    Epilogue ep = Epilogue::at(C, gelu_out, gelu_in, bias, c_bs, c_rs, c_cs, accumulate, gelu_mode, b);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                int r = m0 + wm * 32 + i * 16 + e / 16, c = n0 + wn * 64 + j * 16 + e % 16;
                if (r < M && c < N) ep.store(stage[e], r, c);
            }
            __syncwarp();
        }
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc_tf32(MATMUL_PARAMS) {
    matmul_tc<1>(MATMUL_ARGS);
}

extern "C" __global__ void __launch_bounds__(256) matmul_tc_bf16(MATMUL_PARAMS) {
    matmul_tc<2>(MATMUL_ARGS);
}

// ---- split-K reduce ------------------------------------------------------------------
//
//   C[i, j] = (accumulate ? C[i, j] : 0) + Σ_{s = 0..slices-1} ws[s·M·N + i·N + j] + bias[j]
//
// Summed in slice order 0, 1, ..., slices-1 by one thread per element, so the result is
// the same bit for bit on every run (no atomics); the epilogue (bias, accumulate, GELU)
// is the product kernel's, applied once here. Block 256, grid ceil(M·N / 256).
//
// Expected time on an H200 (132 SMs, ~4.3 TB/s, 989 TFLOP/s BF16 dense). The reduce is
// memory-bound: it reads slices·M·N·4 bytes (+ M·N·4 with accumulate) and writes M·N·4,
// after the slices stored slices·M·N·4. The slices are compute-bound like the unsplit
// kernel; what changes is the waves: one tensor-core block per SM (210-254 registers), a
// 128×128 block over all of K = 16384 is 2·128·128·16384 = 537 MFLOP, ~360 µs at today's
// ~20% of an SM's 7.5 TFLOP/s (the issue's reading), and 1/slices of that when split.
//
//   product (dW, K = 16384)   tiles  waves unsplit  slices  waves split  workspace  reduce  total
//   qkv       768 × 2304       108   1 (82% full)      6     5 × 60 µs     42 MB     ~21 µs  358 -> ~320 µs
//   fc_proj  3072 × 768        144   2 (55%)           8     9 × 45 µs     75 MB     ~37 µs  716 -> ~440 µs
//   fc        768 × 3072       144   2 (55%)           8     9 × 45 µs     75 MB     ~37 µs  716 -> ~440 µs
//   attn_proj 768 × 768         36   1 (27%)           7     2 × 51 µs     17 MB     ~ 8 µs  358 -> ~110 µs
//   lm_head  8512 × 768        402   4 (76%)           8    25 × 45 µs    209 MB    ~103 µs 1432 -> ~1220 µs
//
// (reduce: (2·slices + 1)·M·N·4 bytes at 4.3 TB/s.) About 0.84 ms per layer, ~10 ms of a
// ~350 ms step at 16 × 1024; the real gain waits on a GPU (gpu_check gemm times both).
extern "C" __global__ void __launch_bounds__(256)
    matmul_splitk_reduce(const float* ws, int slices, int M, int N, const float* bias, float* C,
                         float* gelu_out, const float* gelu_in, long long c_rs, long long c_cs, int accumulate,
                         int gelu_mode) {
    long long mn = (long long)M * N;
    long long e = (long long)blockIdx.x * 256 + threadIdx.x;
    if (e >= mn) return;
    float v = ws[e];
    for (int s = 1; s < slices; ++s) v += ws[s * mn + e];
    Epilogue ep = {C, gelu_out, gelu_in, bias, c_rs, c_cs, accumulate, gelu_mode};
    ep.store(v, (int)(e / N), (int)(e % N));
}
