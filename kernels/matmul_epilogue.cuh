// The per-element epilogue shared by every matmul kernel (matmul.cu's SIMT and WMMA
// kernels, matmul_splitk_reduce, and any newer product kernel taking MATMUL_PARAMS):
//
//   v = acc + bias[j] (if bias) + C[i, j] (if accumulate)
//   gelu_mode 0: C = v
//   gelu_mode 1, 2: C = v,              gelu_out = GELU(v)          (linear_gelu forward)
//   gelu_mode 3, 4: C = v · GELU'(gelu_in[i, j])                    (matmul_gelu_backward)
//
// Modes 1 and 3 take tanh from tanhf, 2 and 4 from tanh.approx.f32 (common.cuh), as the
// separate gelu kernels do. gelu_out and gelu_in have C's strides (batch, row, column):
// gelu_out is linear_gelu's `out`, gelu_in the saved pre-activation `pre` of the MLP's
// first linear, so mode 3/4 turns the product dY·W_projᵀ into ∂L/∂pre directly and the
// separate gelu_backward pass (2 reads + 1 write of [B·T, 4·d]) disappears. gelu_in may
// be C itself: each element is read, then written, by one thread.
//
// Expected H200 time of the fused GELU backward (estimate, not measured). At ANDREA-120M,
// 16 × 1024 tokens, the product is dY [16384, 768] · W_projᵀ [768, 3072]: 77.3 GFLOP,
// ~78 µs at 989 TFLOP/s BF16 dense, ~390 µs at today's kernels' ~20% (issue 13's
// reading): compute-bound either way. The separate gelu_backward pass it replaces reads
// pre and dout and writes dx, 3 × 16384·3072·4 B = 604 MB, ~140 µs at ~4.3 TB/s per
// layer. Fused, the epilogue reads pre once more (201 MB, ~47 µs of traffic, overlapped
// with the product's math when other blocks are in their main loop) and writes nothing
// extra: ~94-140 µs and one launch saved per layer, ~1.1-1.7 ms of a ~350 ms step (12
// layers). gpu_check gemm's `gemm_epilogue` row times both on one GPU.
//
// The bias gradient of the first linear (Σ_rows ∂L/∂pre) is not fused here. Without
// atomics it needs each block's column sums over its 128 rows (a block-wide reduction
// through shared memory after the staging of the tile, in every kernel variant, and in
// matmul_splitk_reduce, which has one thread per element and no rows to sum) written as
// [M/128, N] partials, then a finishing pass: the same two passes bias_backward already
// makes (column_partials + column_finish, deterministic), which read ∂L/∂pre once,
// 201 MB, ~47 µs per layer, ~0.6 ms per step. Worth doing with the pipelined kernel of
// item 1, whose epilogue owns its tile in registers, once a GPU shows the 47 µs.
//
// A split-K product runs its slices with mode 0 and no bias/accumulate into the
// workspace, and matmul_splitk_reduce applies this epilogue once to the sum.
#pragma once

#include "common.cuh"

#define EPI_PLAIN 0
#define EPI_GELU_EXACT 1
#define EPI_GELU_APPROX 2
#define EPI_GELU_GRAD_EXACT 3
#define EPI_GELU_GRAD_APPROX 4

struct Epilogue {
    float* c;
    float* gelu_out;
    const float* gelu_in;
    const float* bias;
    long long rs, cs;
    int accumulate, gelu_mode;

    // The epilogue of batch entry b, whose C (and gelu_out / gelu_in) start c_bs later.
    static __device__ __forceinline__ Epilogue at(float* C, float* gelu_out, const float* gelu_in,
                                                  const float* bias, long long c_bs, long long c_rs,
                                                  long long c_cs, int accumulate, int gelu_mode,
                                                  long long b) {
        Epilogue e = {C + b * c_bs,
                      gelu_out ? gelu_out + b * c_bs : nullptr,
                      gelu_in ? gelu_in + b * c_bs : nullptr,
                      bias,
                      c_rs,
                      c_cs,
                      accumulate,
                      gelu_mode};
        return e;
    }

    __device__ __forceinline__ void store(float v, int i, int j) const {
        long long off = i * rs + j * cs;
        if (bias) v += bias[j];
        if (accumulate) v += c[off];
        if (gelu_mode == EPI_GELU_GRAD_EXACT) v *= gelu_grad_f<false>(gelu_in[off]);
        else if (gelu_mode == EPI_GELU_GRAD_APPROX) v *= gelu_grad_f<true>(gelu_in[off]);
        c[off] = v;
        if (gelu_mode == EPI_GELU_EXACT) gelu_out[off] = gelu_f<false>(v);
        else if (gelu_mode == EPI_GELU_APPROX) gelu_out[off] = gelu_f<true>(v);
    }

    // Whether store4 may run: C's rows contiguous, and every group of 4 columns starting
    // at a multiple of 4 16-byte aligned in C, gelu_out, gelu_in and bias.
    __device__ __forceinline__ bool vec4() const {
        auto al = [](const void* p) { return p == nullptr || (reinterpret_cast<size_t>(p) & 15) == 0; };
        return cs == 1 && (rs & 3) == 0 && al(c) && al(gelu_out) && al(gelu_in) && al(bias);
    }

    // store() of the four elements (i, j..j+3), j a multiple of 4, when vec4(): 16-byte
    // loads and stores, the same arithmetic per element in the same order (so the same
    // bits as four store() calls).
    __device__ __forceinline__ void store4(float4 v4, int i, int j) const {
        long long off = i * rs + j;
        float v[4] = {v4.x, v4.y, v4.z, v4.w};
        if (bias) {
            float4 b = *reinterpret_cast<const float4*>(bias + j);
            v[0] += b.x, v[1] += b.y, v[2] += b.z, v[3] += b.w;
        }
        if (accumulate) {
            float4 c0 = *reinterpret_cast<const float4*>(c + off);
            v[0] += c0.x, v[1] += c0.y, v[2] += c0.z, v[3] += c0.w;
        }
        if (gelu_mode == EPI_GELU_GRAD_EXACT || gelu_mode == EPI_GELU_GRAD_APPROX) {
            float4 p4 = *reinterpret_cast<const float4*>(gelu_in + off);
            float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
            for (int q = 0; q < 4; ++q)
                v[q] *= gelu_mode == EPI_GELU_GRAD_EXACT ? gelu_grad_f<false>(p[q]) : gelu_grad_f<true>(p[q]);
        }
        *reinterpret_cast<float4*>(c + off) = make_float4(v[0], v[1], v[2], v[3]);
        if (gelu_mode == EPI_GELU_EXACT || gelu_mode == EPI_GELU_APPROX) {
            float o[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) o[q] = gelu_mode == EPI_GELU_EXACT ? gelu_f<false>(v[q]) : gelu_f<true>(v[q]);
            *reinterpret_cast<float4*>(gelu_out + off) = make_float4(o[0], o[1], o[2], o[3]);
        }
    }
};

// The staged store of a block's BM × BN output tile (matmul_mma.cu's default): the tile
// is already in shared memory, element (r, c) of the block (output (m0 + r, n0 + c)) at
// tile[r·LD + c], and is written out in rows of 16-byte groups: thread e of NT takes
// columns 4·(e % (BN/4)) .. + 3 of row e / (BN/4), so the 32 lanes of a warp cover 512
// contiguous bytes of C (one row at BN = 128, two half rows at BN = 64): 4 full 128-byte
// lines per store instruction, against direct fragment stores whose every instruction
// touches 8 rows with 16 of each 32-byte sector written. The epilogue (bias,
// accumulate, GELU, GELU', or nothing for split-K partials) is applied here, on 4
// elements at a time; groups that are not aligned (Epilogue::vec4) or cross N go element
// by element through store(). `row_fault` (tests only) reads the staged row below.
template <int BM, int BN, int LD, int NT>
__device__ __forceinline__ void store_staged(const Epilogue& ep, const float* tile, int m0, int n0, int M, int N,
                                             int row_fault) {
    bool vec = ep.vec4();
#pragma unroll 4
    for (int e = threadIdx.x; e < BM * (BN / 4); e += NT) {
        int r = e / (BN / 4), c = 4 * (e % (BN / 4));
        int i = m0 + r, j = n0 + c;
        if (i >= M || j >= N) continue;
        float4 v = *reinterpret_cast<const float4*>(tile + (r + row_fault) * LD + c);
        if (vec && j + 3 < N) {
            ep.store4(v, i, j);
        } else {
            ep.store(v.x, i, j);
            if (j + 1 < N) ep.store(v.y, i, j + 1);
            if (j + 2 < N) ep.store(v.z, i, j + 2);
            if (j + 3 < N) ep.store(v.w, i, j + 3);
        }
    }
}

// The argument list of every product kernel (the host side is ops_linalg.rs's
// matmul_launch): operands A [M, K] and B [K, N] and C [M, N] with batch/row/column
// strides, the epilogue's pointers (bias [N] or null; gelu_out, gelu_in with C's strides
// or null) and modes, the load modes of A and B (matmul.cu's load_tile), and k_slice
// (0: unsplit; > 0: grid z is the K slice, see matmul.cu).
#define MATMUL_PARAMS                                                                                 \
    const float *A, const float *B, const float *bias, float *C, float *gelu_out, const float *gelu_in, \
        int M, int N, int K, long long a_bs, long long a_rs, long long a_cs, long long b_bs,           \
        long long b_rs, long long b_cs, long long c_bs, long long c_rs, long long c_cs, int a_mode,    \
        int b_mode, int accumulate, int gelu_mode, int k_slice

#define MATMUL_ARGS                                                                                   \
    A, B, bias, C, gelu_out, gelu_in, M, N, K, a_bs, a_rs, a_cs, b_bs, b_rs, b_cs, c_bs, c_rs, c_cs, \
        a_mode, b_mode, accumulate, gelu_mode, k_slice
