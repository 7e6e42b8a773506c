// Batched strided matmul on the tensor cores by mma.sync, with a 3-stage cp.async
// pipeline: the same arguments and semantics as matmul.cu's kernels (strides for
// transposes, batch, bias, accumulate, GELU epilogue, split-K `k_slice`), so
// plan::matmul picks either (ANDREA_CUDA_MATMUL=wmma|mma, default mma).
//
//   matmul_mma_{tf32,bf16}_{128x128,128x64,64x64}[_direct]: tile BM × BN, K step 32.
//     128x128: 8 warps as 2 × 4, warp tile 64 × 32 (4 × 4 mma tiles of 16 × 8)
//     128x64:  4 warps as 2 × 2, warp tile 64 × 32
//     64x64:   4 warps as 2 × 2, warp tile 32 × 32 (2 × 4 mma tiles)
//     Grid (ceil(N / BN), ceil(M / BM), batch or slices), dynamic shared memory
//     3 · (BM + BN) · 32 · 4 bytes: 96 / 72 / 48 KiB (plan::matmul::mma_smem).
//
// Operands are FP32 in memory. Each stage holds FP32 tiles copied by cp.async (16-byte
// copies along the operand's contiguous dimension when plan::matmul::load_mode allows
// float4, else 4-byte copies), zero-filled past the matrix (src_bytes), so edge tiles
// (M or N not a multiple of the tile, the half-empty last column tile of N = 8512) and a
// K tail need no other masking; only the epilogue checks bounds.
//
// How operands reach the fragments: each lane reads its fragment elements straight from
// the FP32 stage (LDS.64 pairs along K for BF16 when the tile is K-contiguous, LDS.32
// otherwise) and converts in registers (pack_bf16x2: nearest even; f32_to_tf32:
// cvt.rna), with no BF16 copy of the tile and no ldmatrix (ldmatrix moves b16 rows, and
// a BF16 copy would need a convert pass through shared memory). Shared-memory traffic
// per K step of 16 and a 128 × 128 tile: direct, 8 warps × (64 + 32) rows × 16 × 4 B =
// 48 KiB read; a convert pass reads 24 KiB of FP32 and writes 12 KiB of BF16, and
// ldmatrix then reads 8 warps × 96 × 16 × 2 B = 24 KiB: 60 KiB. The direct path moves
// less and has no extra barrier; it issues more load instructions (48 LDS.64 per warp
// per K16 against 6 ldmatrix.x4), which a GPU run has to weigh (gpu_check's gemm rows
// time both kernels).
//
// Shared layout, per operand and stage, one of two by the operand's strides, with an
// XOR swizzle of its 16-byte units that makes the fragment reads and the cp.async
// writes conflict-free (checked per pattern below):
//   K-contiguous [I][32] (I = BM rows of A, or BN columns of B): float (i, k) at
//     i·32 + 4·((k / 4) ^ s(i)) + k % 4, s(i) = 2·(i % 4) for BF16 (the LDS.64 pairs of
//     one half-warp, rows g = 0..3 and units t / 2, land in 8 distinct units), i % 8
//     for TF32 (rows g = 0..7, one unit each, lanes t = 0..3 within it).
//   I-contiguous [32][I]: float (k, i) at k·I + 4·((i / 4) ^ s(k)) + i % 4,
//     s(k) = 2·((k / 2) % 4) for BF16 (lanes (g, t) read k = 2t: units (g / 4) ^ 2t
//     are 8 distinct), 2·(k % 4) for TF32 (k = t).
//   A cp.async row of 8 consecutive units is permuted within itself: conflict-free.
//
// Pipeline: tiles 0 and 1 are in flight before the loop; iteration kt waits for tile kt
// (cp_async_wait<1>: all but the newest group), a barrier (every warp is done with the
// stage about to be refilled), issues tile kt + 2 into that stage, commits (an empty
// group past the last tile keeps the count uniform) and computes tile kt.
//
// The output tile (STAGED, the default): after the main loop the accumulators go to
// shared memory (the pipeline's, now free) and store_staged (matmul_epilogue.cuh) writes
// them as 16-byte row groups with the epilogue applied; the _direct kernels store each
// lane's fragment elements straight to global memory. Expected gain (estimate, not
// measured): a 128 × 128 tile is 64 KiB = 2048 32-byte sectors of C; direct, each of the
// 512 warp store instructions (32 lanes × 4 B) touches 8 rows, one sector each, half
// filled: 4096 sector writes and 512 instructions; staged, 128 instructions of 512
// contiguous bytes: 2048 sectors, plus 64 KiB written to and read from shared memory
// (~1 K clk of the SM's 128 B/clk, against ~18 K clk of main loop at K = 768). The same
// ratio holds for the C read of accumulate and the gelu_in read / gelu_out write of the
// GELU epilogues. Store traffic is ~8% of the bytes of a K = 768 product (C 4·M·N
// against the FP32 operand tiles re-read from L2), so the gain is at most a few percent
// where stores overlap other blocks' main loops, up to ~10% where they do not (the
// products with GELU epilogues write or read two [M, N] tensors); split-K partials (the
// dW products) gain the same on their workspace writes. gpu_check gemm's
// `direct_median_ms` times the _direct kernel on the same product.
//
// The fault argument of the other kernels does not exist here: tests plant faults by
// bits 4.. of a_mode (0 in every real launch): 1 = the fragment reads ignore the
// swizzle the copies used, 2 = the wait lets a stage be read before it lands, 3 = the
// staged store reads each row from the row below, 4 = no barrier between the last
// fragment reads and the staging writes that overwrite the stages, 5 = no barrier
// between the staging writes and the staged reads.
//
// Expected H200 times (estimates, not measured; H200: 989 TFLOP/s dense BF16, ~495 TF32,
// 4.3 TB/s, 132 SMs, 228 KB shared memory per SM). Registers from `cargo xtask
// build-kernels` (sm_90) decide blocks per SM: see plan::matmul::blocks_per_sm. A
// product is bound by the tensor cores when its arithmetic intensity beats
// 989e12 / 4.3e12 = 230 FLOP/B (BF16); every product of an ANDREA-120M step at 16 × 1024
// does (the smallest, attn_proj, is 2·16384·768·768 FLOPs over (16384·768·2 + 768²)·4 B
// = 19.3 GFLOP / 103 MB = 190 FLOP/B, nearly so). The per-SM limit that binds here is
// shared-memory bandwidth (128 B/clk): per K16 step a 128 × 128 block reads 48 KiB
// = 384 clk for 128·128·16·2 = 524 kFLOP, i.e. 1365 FLOP/clk/SM = 36% of the SM's
// ~3750 BF16 FLOP/clk (at 1.98 GHz), ~360 TFLOP/s for the whole GPU; TF32 (495 peak)
// the same bytes, ~72% of its peak. Expected per product (BF16, 128 × 128 tiles, ~360
// TFLOP/s sustained, wave quantisation on 132 SMs × 2 blocks not counted):
//   qkv     16384 × 2304 × 768   58.0 GFLOP  ~0.16 ms   (cuBLAS at ~650 TFLOP/s: ~0.09)
//   attn_proj 16384 × 768 × 768  19.3        ~0.054 ms
//   fc      16384 × 3072 × 768   77.3        ~0.21 ms
//   fc_proj 16384 × 768 × 3072   77.3        ~0.21 ms
//   lm_head 16384 × 8512 × 768  214          ~0.59 ms
//   (the dX and dW products have the same FLOPs; dW's K = 16384 also needs split-K.)
// So ~55% of cuBLAS in BF16 by this estimate: short of the issue's 70% because the
// FP32 operands cost twice the shared bandwidth of BF16 ones; what would close it is
// BF16 operands in memory (then ldmatrix from BF16 stages: half the bytes) or wgmma on
// sm_90a, which reads shared memory without the register file.
#include "common.cuh"
#include "matmul_epilogue.cuh"

#define MMA_BK 32
#define MMA_STAGES 3

// This slice's share of K (matmul.cu's slice_k, which this file does not include).
__device__ __forceinline__ int mma_slice_k(int K, int k_slice) {
    return k_slice > 0 ? min(K - (int)blockIdx.z * k_slice, k_slice) : K;
}

#ifdef ANDREA_CUDA_EMU
#define mma_smem (emu_dynamic_smem())
#else
extern __shared__ __align__(16) float mma_smem[];
#endif

// The swizzles (CVT 1: TF32, 2: BF16).
template <int CVT>
__device__ __forceinline__ int mma_swz_kc(int i) {
    return CVT == 2 ? (i & 3) << 1 : i & 7;
}
template <int CVT>
__device__ __forceinline__ int mma_swz_ic(int k) {
    return CVT == 2 ? ((k >> 1) & 3) << 1 : (k & 3) << 1;
}

// Offset of float (i, k) in a stage tile: K-contiguous [I][32] or I-contiguous [32][I].
template <int CVT, int I>
__device__ __forceinline__ int mma_off(bool kcontig, int i, int k, bool swz) {
    if (kcontig) return i * MMA_BK + ((((k >> 2) ^ (swz ? mma_swz_kc<CVT>(i) : 0))) << 2) + (k & 3);
    return k * I + ((((i >> 2) ^ (swz ? mma_swz_ic<CVT>(k) : 0))) << 2) + (i & 3);
}

// Issues the cp.async copies of one operand's I × 32 tile: element (i, k) at
// src[i·si + k·sk], valid for i < ni, k < nk (zero-filled elsewhere). `vec`: 16-byte
// copies along the contiguous dimension (sk = 1 when kcontig, si = 1 otherwise).
template <int CVT, int I, int NT>
__device__ __forceinline__ void mma_load(float* dst, const float* src, int ni, int nk, long long si,
                                         long long sk, bool kcontig, bool vec) {
    int tid = threadIdx.x;
    if (vec && kcontig) {
#pragma unroll 1
        for (int e = tid; e < I * (MMA_BK / 4); e += NT) {
            int i = e / (MMA_BK / 4), u = e % (MMA_BK / 4);
            int valid = i < ni ? min(max(nk - 4 * u, 0), 4) : 0;
            cp_async_16(dst + mma_off<CVT, I>(true, i, 4 * u, true), valid ? src + i * si + 4 * u : src,
                        4 * valid);
        }
    } else if (vec) {
#pragma unroll 1
        for (int e = tid; e < MMA_BK * (I / 4); e += NT) {
            int k = e / (I / 4), u = e % (I / 4);
            int valid = k < nk ? min(max(ni - 4 * u, 0), 4) : 0;
            cp_async_16(dst + mma_off<CVT, I>(false, 4 * u, k, true), valid ? src + k * sk + 4 * u : src,
                        4 * valid);
        }
    } else {
#pragma unroll 1
        for (int e = tid; e < I * MMA_BK; e += NT) {
            // Neighbouring threads walk the dimension the layout keeps contiguous.
            int i = kcontig ? e / MMA_BK : e % I, k = kcontig ? e % MMA_BK : e / I;
            bool valid = i < ni && k < nk;
            cp_async_4(dst + mma_off<CVT, I>(kcontig, i, k, true), valid ? src + i * si + k * sk : src,
                       valid ? 4 : 0);
        }
    }
}

template <int CVT, int BM, int BN, int WM, int WN, bool STAGED>
__device__ __forceinline__ void matmul_mma(MATMUL_PARAMS) {
    const int NT = WM * WN * 32, WTM = BM / WM, WTN = BN / WN;
    const int MT = WTM / 16, NTL = WTN / 8;
    const int STAGE = (BM + BN) * MMA_BK;
    float* smem = mma_smem;

    int fault = a_mode >> 4;
    a_mode &= 15;
    bool swz = fault != 1;
    K = mma_slice_k(K, k_slice);
    int b = blockIdx.z;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const float* Ab = A + b * a_bs + m0 * a_rs;
    const float* Bb = B + b * b_bs + n0 * b_cs;
    // A is [M, K] (i = row), B is [K, N] (i = column); LoadMode 2 / 3 are float4 along
    // columns / rows, 0 / 1 scalar walking columns / rows.
    bool akc = a_mode == 0 || a_mode == 2, bkc = b_mode == 1 || b_mode == 3;
    bool avec = a_mode >= 2, bvec = b_mode >= 2;
    int ktiles = (K + MMA_BK - 1) / MMA_BK;

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, t = lane % 4;
    int wm = warp / WN, wn = warp % WN;

    float acc[MT][NTL][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NTL; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
    for (int s = 0; s < MMA_STAGES - 1; ++s) {
        if (s < ktiles) {
            float* st = smem + s * STAGE;
            int k0 = s * MMA_BK;
            mma_load<CVT, BM, NT>(st, Ab + k0 * a_cs, M - m0, K - k0, a_rs, a_cs, akc, avec);
            mma_load<CVT, BN, NT>(st + BM * MMA_BK, Bb + k0 * b_rs, N - n0, K - k0, b_cs, b_rs, bkc, bvec);
        }
        cp_async_commit();
    }

    for (int kt = 0; kt < ktiles; ++kt) {
        if (fault == 2) cp_async_wait<MMA_STAGES - 1>();
        else cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();
        int next = kt + MMA_STAGES - 1;
        if (next < ktiles) {
            float* st = smem + (next % MMA_STAGES) * STAGE;
            int k0 = next * MMA_BK;
            mma_load<CVT, BM, NT>(st, Ab + k0 * a_cs, M - m0, K - k0, a_rs, a_cs, akc, avec);
            mma_load<CVT, BN, NT>(st + BM * MMA_BK, Bb + k0 * b_rs, N - n0, K - k0, b_cs, b_rs, bkc, bvec);
        }
        cp_async_commit();

        const float* As = smem + (kt % MMA_STAGES) * STAGE;
        const float* Bs = As + BM * MMA_BK;
        if (CVT == 2) {
#pragma unroll
            for (int ks = 0; ks < MMA_BK; ks += 16) {
                // B's fragments for the whole warp tile, then A's one m-tile at a time
                // (fewer live registers: 2·NTL + 4).
                unsigned bf[NTL][2];
#pragma unroll
                for (int j = 0; j < NTL; ++j)
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        int n = wn * WTN + 8 * j + g, k = ks + 2 * t + 8 * q;
                        float2 v;
                        if (bkc) v = *reinterpret_cast<const float2*>(Bs + mma_off<CVT, BN>(true, n, k, swz));
                        else v = make_float2(Bs[mma_off<CVT, BN>(false, n, k, swz)],
                                             Bs[mma_off<CVT, BN>(false, n, k + 1, swz)]);
                        bf[j][q] = pack_bf16x2(v.x, v.y);
                    }
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    unsigned af[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        int r = wm * WTM + 16 * i + g + 8 * (q & 1), k = ks + 2 * t + 8 * (q >> 1);
                        float2 v;
                        if (akc) v = *reinterpret_cast<const float2*>(As + mma_off<CVT, BM>(true, r, k, swz));
                        else v = make_float2(As[mma_off<CVT, BM>(false, r, k, swz)],
                                             As[mma_off<CVT, BM>(false, r, k + 1, swz)]);
                        af[q] = pack_bf16x2(v.x, v.y);
                    }
#pragma unroll
                    for (int j = 0; j < NTL; ++j) mma_bf16_m16n8k16(acc[i][j], af, bf[j], acc[i][j]);
                }
            }
        } else {
#pragma unroll 2
            for (int ks = 0; ks < MMA_BK; ks += 8) {
                unsigned bf[NTL][2];
#pragma unroll
                for (int j = 0; j < NTL; ++j)
#pragma unroll
                    for (int q = 0; q < 2; ++q) {
                        int n = wn * WTN + 8 * j + g, k = ks + t + 4 * q;
                        bf[j][q] = f32_to_tf32(Bs[mma_off<CVT, BN>(bkc, n, k, swz)]);
                    }
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    unsigned af[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        int r = wm * WTM + 16 * i + g + 8 * (q & 1), k = ks + t + 4 * (q >> 1);
                        af[q] = f32_to_tf32(As[mma_off<CVT, BM>(akc, r, k, swz)]);
                    }
#pragma unroll
                    for (int j = 0; j < NTL; ++j) mma_tf32_m16n8k8(acc[i][j], af, bf[j], acc[i][j]);
                }
            }
        }
    }
    cp_async_wait<0>();  // only empty groups are left; retire them before exit

    Epilogue ep = Epilogue::at(C, gelu_out, gelu_in, bias, c_bs, c_rs, c_cs, accumulate, gelu_mode, b);
    if (STAGED) {
        // The tile goes through the pipeline's shared memory, rows padded to BN + 8 floats:
        // a half-warp's float2 writes (rows g = 0..3, columns 2t) then fall in banks
        // 8g + 2t, all distinct, and the rows' 16-byte reads in store_staged stay
        // contiguous. The first barrier: every warp has read its last fragments from the
        // stages this overwrites; the second: the whole tile is written before any thread
        // reads another warp's part.
        const int LD = BN + 8;
        static_assert(BM * LD <= MMA_STAGES * STAGE, "the staged tile fits in the pipeline's shared memory");
        float* tile = smem;
        if (fault != 4) __syncthreads();
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NTL; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int r = wm * WTM + 16 * i + g + 8 * h, c = wn * WTN + 8 * j + 2 * t;
                    *reinterpret_cast<float2*>(tile + r * LD + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
        if (fault != 5) __syncthreads();
        store_staged<BM, BN, LD, NT>(ep, tile, m0, n0, M, N, fault == 3);
    } else {
        // Direct: each lane stores its fragments' elements one float at a time.
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NTL; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    int r = m0 + wm * WTM + 16 * i + g + 8 * (q >> 1), c = n0 + wn * WTN + 8 * j + 2 * t + (q & 1);
                    if (r < M && c < N) ep.store(acc[i][j][q], r, c);
                }
    }
}

// Each tile twice: NAME stores its output staged through shared memory (the default),
// NAME_direct straight from the fragments (plan::matmul::MmaStore, ANDREA_CUDA_MMA_STORE).
#define MMA_KERNEL(NAME, CVT, BM, BN, WM, WN, MINB)                                                  \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB) NAME(MATMUL_PARAMS) {           \
        matmul_mma<CVT, BM, BN, WM, WN, true>(MATMUL_ARGS);                                          \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB) NAME##_direct(MATMUL_PARAMS) { \
        matmul_mma<CVT, BM, BN, WM, WN, false>(MATMUL_ARGS);                                         \
    }

// Minimum blocks per SM: 2 for 128x128 (96 KiB each: 192 of 228 KB; <= 128 registers),
// 3 for 128x64 (72 KiB: 216 KB; <= 168 registers), 4 for 64x64 (48 KiB: 192 KB; <= 128).
MMA_KERNEL(matmul_mma_tf32_128x128, 1, 128, 128, 2, 4, 2)
MMA_KERNEL(matmul_mma_tf32_128x64, 1, 128, 64, 2, 2, 3)
MMA_KERNEL(matmul_mma_tf32_64x64, 1, 64, 64, 2, 2, 4)
MMA_KERNEL(matmul_mma_bf16_128x128, 2, 128, 128, 2, 4, 2)
MMA_KERNEL(matmul_mma_bf16_128x64, 2, 128, 64, 2, 2, 3)
MMA_KERNEL(matmul_mma_bf16_64x64, 2, 64, 64, 2, 2, 4)

#undef mma_smem
