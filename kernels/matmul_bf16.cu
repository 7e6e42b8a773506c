// Batched strided matmul on the tensor cores with BF16 operands in global memory
// (MatmulPrecision::Bf16): the arguments of matmul.cu's kernels (MATMUL_PARAMS), A and B
// pointing at BF16 copies of the operands (ops_linalg.rs converts them with f32_to_bf16
// first, until activations are stored in BF16), FP32 accumulation, FP32 output with
// matmul_epilogue.cuh's epilogue (bias / accumulate / GELU / GELU', applied after the
// main loop), split-K `k_slice` as matmul_mma.cu.
//
//   matmul_bf16_128x128_{ak,am}_{bk,bn}: the operand layouts as template parameters:
//     ak: A [M, K] has K contiguous (a_cs = 1), am: M contiguous (a_rs = 1);
//     bk: B [K, N] has K contiguous (b_rs = 1), bn: N contiguous (b_cs = 1).
//     Tile 128 × 128, K step 64, 8 warps as 2 × 4, warp tile 64 × 32 (4 × 4 mma tiles
//     of 16 × 8); grid (ceil(N / 128), ceil(M / 128), batch or slices); dynamic shared
//     memory 3 stages · (128 + 128) · 64 · 2 B = 96 KiB (plan::matmul::GEMM_SMEM).
//   The host (plan::matmul::gemm_layout) guarantees: the contiguous dimension has stride
//   1, every other stride is a multiple of 8 elements and the base 16-byte aligned (so
//   every 8-element chunk a copy moves starts 16-byte aligned), and K % 8 = 0 when an
//   operand is K-contiguous. Other shapes run matmul_mma.cu.
//
// Copies: each thread moves 4 chunks of 16 bytes per operand and K tile by cp.async.cg,
// at addresses computed once before the loop and advanced by 64 · (K stride) per tile;
// chunks past M or N are zero-filled (src_bytes fixed per chunk for the whole loop: 0
// for a row past the operand, whose address is then never read). The K remainder is the *first* tile: tile t covers
// k in [64·t - s, 64·t - s + 64), s = 64·ceil(K / 64) - K, so only tile 0 masks
// k < 0 (a separate instantiation of the copy, in the prologue) and the main loop's
// copies take no bound check at all.
//
// Shared layout, 128-byte XOR swizzle of 16-byte chunks (8 BF16):
//   K-contiguous tile [I][64] (rows of 128 B): chunk c of row i at i·64 + 8·(c ^ (i % 8)).
//   I-contiguous tile [64][I] (rows of 2·I B):  chunk c of row k at k·I + 8·(c ^ (k % 8)).
// An ldmatrix phase reads 8 rows i..i+7 (or k..k+7, 8-aligned) at one logical chunk:
// their physical chunks c ^ (row % 8) are 8 distinct 16-byte bank groups, so every
// fragment read and every copy (8 or 16 chunks of one row per 8 or 16 lanes) is
// conflict-free.
//
// Fragments by ldmatrix.x4: K-contiguous tiles without .trans, I-contiguous tiles with
// .trans (8 × 8 blocks stored [k][i] arrive transposed as the mma layout wants), so a
// dW product (A = Xᵀ, M-contiguous) and x·Wᵀ (B = Wᵀ, K-contiguous) take the same path
// as x·W. Per K16 step a warp issues 4 (A) + 2 (B) ldmatrix.x4 for 16 HMMA.
//
// Pipeline: 3 stages; tiles 0 and 1 in flight before the loop; iteration t waits for
// tile t (cp_async_wait<1>), a barrier (every warp is done with the stage about to be
// refilled), issues tile t + 2, commits (an empty group past the last tile keeps the
// count uniform) and computes tile t. The output tile is staged through the pipeline's
// shared memory and stored by store_staged (matmul_epilogue.cuh), as matmul_mma.cu.
//
// Faults (tests only): in the emulator's build (ANDREA_CUDA_EMU) bits 4.. of a_mode
// plant 1 = the fragment reads ignore the swizzle, 2 = the wait lets a stage be read
// before it lands (a skipped pipeline stage), 3 = the .trans fragment reads (of A when
// A is M-contiguous, else of B) take the next row of each 8 × 8 block; nvcc's build
// compiles the fault as the constant 0.
//
// Expected time (an estimate, not measured; the arithmetic is benches/README.md's "GPU"
// model: H100 SXM or H200, 989.4 TFLOP/s dense BF16, 132 SMs at 4096 FLOP/clk, 1.83 GHz).
// `cargo xtask sass-report`: the main loop is 2.4-2.6 instructions per HMMA (64 HMMA per
// warp and K tile), under the ~4 a sub-partition issues per HMMA of tensor work, so issue
// does not bind. Shared memory does: per K16 step a 128 × 128 block reads 8 warps × 6
// ldmatrix.x4 × 512 B = 24 KiB (half of matmul_mma.cu's FP32 reads), 192 clk at
// 128 B/clk, against 2·128·128·16 / 4096 = 128 clk of tensor work: 67 % of the peak,
// ~660 TFLOP/s before wave quantisation; wgmma (sm_90a) reads shared memory without the
// register file and is what would lift it. Per ANDREA-120M product at 16 × 1024 tokens
// (all compute-bound: BF16 operands and an FP32 C are > 300 FLOP per byte):
//   qkv       16384 × 2304 × 768   58.0 GFLOP  ~0.09 ms
//   attn_proj 16384 × 768 × 768    19.3        ~0.03 ms
//   fc        16384 × 3072 × 768   77.3        ~0.12 ms
//   fc_proj   16384 × 768 × 3072   77.3        ~0.12 ms
//   lm_head   16384 × 8512 × 768  214          ~0.32 ms
// The dX and dW products have the same FLOPs (dW by split-K over K = 16384). The
// f32_to_bf16 conversions in front cost 6 B per operand element, ~0.025 ms per
// [16384, 768] activation at ~3.0 TB/s (H100; ~0.018 ms on an H200), until activations
// are stored in BF16.
#include "common.cuh"
#include "matmul_epilogue.cuh"

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 64
#define GEMM_STAGES 3
#define GEMM_THREADS 256

#ifdef ANDREA_CUDA_EMU
#define gemm_smem (emu_dynamic_smem())
#define GEMM_FAULT(a_mode) ((a_mode) >> 4)
#else
extern __shared__ __align__(128) float gemm_smem[];
#define GEMM_FAULT(a_mode) 0
#endif

typedef unsigned short bf16_t;

// Element offset of chunk `c` of row `r` in a tile whose rows hold `W` BF16.
template <int W>
__device__ __forceinline__ int gemm_swz(int r, int c, bool swz = true) {
    return r * W + 8 * (swz ? c ^ (r & 7) : c);
}

// One operand's copies: a 128 × 64 tile (I × K) in 1024 chunks, 4 per thread, chunk q
// of a thread 32 I-rows (KC) or 16 K-rows (IC) below chunk q - 1, so one pointer, one
// shared offset and one stride describe all four. KC: the tile is K-contiguous
// ([128][64], 8 chunks a row), else I-contiguous ([64][128], 16 chunks a row). A chunk
// past the operand (I >= ni) keeps src_bytes 0 for the whole loop (its pointer is never
// dereferenced: cp.async reads src_bytes bytes).
template <bool KC>
struct GemmLoader {
    const bf16_t* src;  // chunk 0's source in the tile the loop copies next
    long long dq;       // elements from chunk q to chunk q + 1
    long long step;     // elements between consecutive K tiles
    int dst;            // chunk 0's element offset in a stage
    int first;          // KC: I-rows left below chunk 0's row; IC: chunk 0's src_bytes
    int krow;           // chunk 0's K index within the tile (k-row, or 8·chunk when KC)

    // `base`: element (i0, k = -s) of the operand, `ni`: valid rows (I dimension) from
    // i0, `si` / `sk`: strides along I and K.
    __device__ __forceinline__ void init(const bf16_t* base, int ni, long long si, long long sk) {
        int tid = threadIdx.x;
        step = GEMM_BK * sk;
        if (KC) {
            int i = tid / 8, c = tid % 8;
            src = base + (long long)i * si + 8 * c;
            dq = 32 * si;
            dst = gemm_swz<GEMM_BK>(i, c);
            first = ni - i;
            krow = 8 * c;
        } else {
            int k = tid / 16, c = tid % 16;
            src = base + (long long)k * sk + 8 * c;
            dq = 16 * sk;
            dst = gemm_swz<GEMM_BM>(k, c);
            first = 2 * min(max(ni - 8 * c, 0), 8);
            krow = k;
        }
    }

    // Issues the tile's copies into `stage` and advances to the next tile. MASK_K (tile 0
    // only): chunks at k < 0 (K index < s) are zero-filled from a valid address.
    template <bool MASK_K>
    __device__ __forceinline__ void load(bf16_t* stage, int s, const bf16_t* valid_ptr) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            int bytes = KC ? (32 * q < first ? 16 : 0) : first;
            bool in = !MASK_K || (KC ? krow : krow + 16 * q) >= s;
            cp_async_16(stage + dst + 2048 * q, in ? src + q * dq : valid_ptr, in ? bytes : 0);
        }
        src += step;
    }
};

// Byte offset within a stage tile of the row that this lane supplies to the ldmatrix.x4
// reading the 16 × 16 block at (i0, 0): matrix m = lane / 8 covers I half `ih` and K
// half `kh` (A: ih = m % 2, kh = m / 2; B: kh = m % 2, ih = m / 2, so that r[0..1] and
// r[2..3] are the b-fragments of two n8 tiles). The other blocks a warp reads follow
// without recomputing the swizzle (`gemm_block`).
template <bool KC, int I>
__device__ __forceinline__ int gemm_frag_off(int lane, int i0, int ih, int kh, int fault) {
    int r8 = lane & 7;
    if (KC) return 2 * gemm_swz<GEMM_BK>(i0 + r8 + 8 * ih, kh, fault != 1);
    if (fault == 3) r8 = (r8 + 1) & 7;
    return 2 * gemm_swz<I>(r8 + 8 * kh, i0 / 8 + ih, fault != 1);
}

// The offset of block (i0 + 16·x, 16·kk) from block (i0, 0)'s `off`, where the tile
// starts 128-byte aligned: K-contiguous, 16 rows further is +16·128 B and K chunks
// 2·kk further flip bits 5-6 of the swizzled chunk (c ^ r = (c0 ^ r) ^ 2·kk for c0 < 2);
// I-contiguous, 16 K-rows further is +16·2·I B and 16 columns (2 chunks) further flip
// the same bits. One LOP3 (and an add the ldmatrix takes as its immediate) per block.
template <bool KC, int I>
__device__ __forceinline__ int gemm_block(int off, int x, int kk) {
    if (KC) return (off ^ (32 * kk)) + 16 * 2 * GEMM_BK * x;
    return (off ^ (32 * x)) + 16 * 2 * I * kk;
}

template <bool KC>
__device__ __forceinline__ void gemm_ldsm(unsigned (&r)[4], const char* p) {
    if (KC) ldmatrix_x4(r, p);
    else ldmatrix_x4_trans(r, p);
}

template <bool AKC, bool BKC>
__device__ __forceinline__ void matmul_bf16(MATMUL_PARAMS) {
    const int WN = 4, WTM = 64, WTN = 32, MT = WTM / 16, NTL = WTN / 8;
    const int TILE = 128 * GEMM_BK;  // elements of one operand's stage tile
    const int STAGE = 2 * TILE;
    bf16_t* smem = reinterpret_cast<bf16_t*>(gemm_smem);
    const int fault = GEMM_FAULT(a_mode);
    (void)b_mode;

    K = k_slice > 0 ? min(K - (int)blockIdx.z * k_slice, k_slice) : K;
    int b = blockIdx.z;
    int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    int ktiles = (K + GEMM_BK - 1) / GEMM_BK;
    int s = ktiles * GEMM_BK - K;  // tile 0 starts at k = -s
    const bf16_t* Ab = reinterpret_cast<const bf16_t*>(A) + b * a_bs + m0 * a_rs;
    const bf16_t* Bb = reinterpret_cast<const bf16_t*>(B) + b * b_bs + n0 * b_cs;

    GemmLoader<AKC> la;
    GemmLoader<BKC> lb;
    la.init(Ab - s * a_cs, M - m0, a_rs, a_cs);
    lb.init(Bb - s * b_rs, N - n0, b_cs, b_rs);

    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int wm = warp / WN, wn = warp % WN;

    float acc[MT][NTL][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NTL; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    if (ktiles > 0) {
        la.template load<true>(smem, s, Ab);
        lb.template load<true>(smem + TILE, s, Bb);
    }
    cp_async_commit();
    if (ktiles > 1) {
        la.template load<false>(smem + STAGE, s, Ab);
        lb.template load<false>(smem + STAGE + TILE, s, Bb);
    }
    cp_async_commit();

    int read = 0, write = 2 * STAGE;  // element offsets of the stages read and refilled
    const char* base = reinterpret_cast<const char*>(smem);
    const int a_off = gemm_frag_off<AKC, GEMM_BM>(lane, wm * WTM, (lane >> 3) & 1, lane >> 4, fault);
    // Fault 3 on one operand only: the same wrong row in both would permute K alike in
    // A and B and leave every product unchanged.
    const int b_off = gemm_frag_off<BKC, GEMM_BN>(lane, wn * WTN, lane >> 4, (lane >> 3) & 1,
                                                  !AKC && fault == 3 ? 0 : fault);
    for (int kt = 0; kt < ktiles; ++kt) {
        if (fault == 2) cp_async_wait<GEMM_STAGES - 1>();
        else cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads();
        if (kt + GEMM_STAGES - 1 < ktiles) {
            la.template load<false>(smem + write, s, Ab);
            lb.template load<false>(smem + write + TILE, s, Bb);
        }
        cp_async_commit();

        int ao = 2 * read + a_off, bo = 2 * read + 2 * TILE + b_off;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK / 16; ++kk) {
            // B's fragments for the warp tile, then A's one m-tile at a time (fewer live
            // registers: 8 + 4).
            unsigned bfr[NTL / 2][4];
#pragma unroll
            for (int j = 0; j < NTL / 2; ++j) gemm_ldsm<BKC>(bfr[j], base + gemm_block<BKC, GEMM_BN>(bo, j, kk));
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                unsigned af[4];
                gemm_ldsm<AKC>(af, base + gemm_block<AKC, GEMM_BM>(ao, i, kk));
#pragma unroll
                for (int j = 0; j < NTL; ++j) {
                    const unsigned bj[2] = {bfr[j / 2][2 * (j % 2)], bfr[j / 2][2 * (j % 2) + 1]};
                    mma_bf16_m16n8k16(acc[i][j], af, bj, acc[i][j]);
                }
            }
        }
        read = read == 2 * STAGE ? 0 : read + STAGE;
        write = write == 2 * STAGE ? 0 : write + STAGE;
    }
    cp_async_wait<0>();  // only empty groups are left; retire them before exit

    // The output tile through the stages' shared memory, rows padded to 128 + 8 floats
    // (matmul_mma.cu's staged store: conflict-free float2 writes, 16-byte row reads).
    Epilogue ep = Epilogue::at(C, gelu_out, gelu_in, bias, c_bs, c_rs, c_cs, accumulate, gelu_mode, b);
    const int LD = GEMM_BN + 8;
    static_assert(GEMM_BM * LD * 4 <= GEMM_STAGES * STAGE * 2, "the staged tile fits in the pipeline's shared memory");
    float* tile = gemm_smem;
    int g = lane / 4, t = lane % 4;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NTL; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int r = wm * WTM + 16 * i + g + 8 * h, c = wn * WTN + 8 * j + 2 * t;
                *reinterpret_cast<float2*>(tile + r * LD + c) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    __syncthreads();
    store_staged<GEMM_BM, GEMM_BN, LD, GEMM_THREADS>(ep, tile, m0, n0, M, N, 0);
}

#define GEMM_KERNEL(NAME, AKC, BKC)                                                            \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 2) NAME(MATMUL_PARAMS) { \
        matmul_bf16<AKC, BKC>(MATMUL_ARGS);                                                    \
    }

// 2 blocks per SM (96 KiB each: 192 of 228 KB; <= 128 registers).
GEMM_KERNEL(matmul_bf16_128x128_ak_bk, true, true)
GEMM_KERNEL(matmul_bf16_128x128_ak_bn, true, false)
GEMM_KERNEL(matmul_bf16_128x128_am_bk, false, true)
GEMM_KERNEL(matmul_bf16_128x128_am_bn, false, false)

#undef gemm_smem
#undef GEMM_FAULT
