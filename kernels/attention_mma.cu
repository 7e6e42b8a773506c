// Fused causal attention on tensor cores (FlashAttention-2 style), forward and backward,
// with TF32 (mma.m16n8k8) or BF16 (mma.m16n8k16) operands and FP32 accumulation. The
// same math as kernels/attention.cu (which stays the FP32 path and the reference):
// query t (absolute position pos_offset + t) sees keys j <= pos_offset + t, scale =
// 1/sqrt(D), element (b, t, h, d) of every heads view at b·bs + t·ss + h·D + d, and the
// workspace is the same log-sum-exp per query row, lse = log Σ_j exp(scale·q·k_j).
//
// Every kernel: block 128 threads = 4 warps, each warp owning 16 rows (queries in the
// forward and dq kernels, keys in dkdv) of the block's 64. The operands the warp keeps
// all along (Q in the forward; Q and dO in dq; K and V in dkdv) are staged once through
// shared memory and held as mma fragments in registers. The other side is streamed in
// tiles of TILE rows (64, 32, 16 for D = 32, 64, 128: plan::attention fits two tiles in
// 48 KiB) with cp.async into two buffers, tile i+1 landing while tile i is computed.
// Operands stay FP32 in memory and in shared memory; they are rounded to TF32 / BF16 when
// a fragment is built from them (cvt.rna.tf32 / cvt.rn.bf16x2). Rows past T are staged
// as zeros (cp.async with 0 source bytes) and never stored.
//
// Fragments. Lane l is g = l / 4, t = l % 4 (common.cuh). An accumulator tile of 8
// columns holds row g's columns 2t, 2t+1 and row g+8's in c[0..1], c[2..3]; an A operand
// built from "pairs" (row r, columns k0 + 8c + 2t, +1) for rows g, g+8 and chunks c < K/8
// matches that layout, so a score tile is reused as the A operand of the next product
// without leaving registers (FlashAttention-2's trick). For TF32 (K = 8) the pair's two
// columns go to a[0] / a[2] (and B's to b[0] / b[1]): a fixed permutation of the k index
// inside each 8-chunk, the same on both operands, which a sum over k does not see.
//
// Forward, attention_mma_fwd_<p>_d<D>: grid (ceil(Tq / 64), H, B). Per key tile: S =
// Q·Kᵀ (scaled, in base 2: x = S·scale·log2 e), rows' running max m and sum l
// (l per lane, reduced over the row's 4 lanes at the end), O = O·2^(m - m') + P·V.
// Tiles past the block's last visible key are never loaded; a warp skips tiles past its
// own last visible key; the causal / length mask is applied only to the tiles that
// straddle it. out = O / l, lse = ln 2·(m + log2 l).
//
// Backward (pos_offset = 0, Tq = Tk = T), P recomputed as 2^(x - lse·log2 e):
//   attention_mma_bwd_dot: Dt = Σ_d dO_t·O_t into the scratch [B, H, T] (one warp a row).
//   attention_mma_bwd_dkdv_<p>_d<D>: grid (ceil(T / 64), H, B); the block's 64 keys, its
//     query tiles from its first key on: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dSᵀ = Pᵀ∘(dPᵀ - D),
//     dV += Pᵀ·dO, dK += dSᵀ·Q; dk = scale·dK.
//   attention_mma_bwd_dq_<p>_d<D>: grid (ceil(T / 64), H, B); the block's 64 queries, key
//     tiles up to its last query: S, dP = dO·Vᵀ, dS, dQ += dS·K; dq = scale·dQ.
// Each output element has one writer and every sum runs in an order fixed by the shapes:
// no atomics, bit-identical runs.
//
// Shared memory rows are padded (Q, K, dO to D + 8 floats, the V tile of the forward to
// D + 4) so that the pair loads (8 bytes at row·LD + 2t) and the column loads (4 bytes
// at (2t)·LD + g) of a warp hit distinct banks; dq's K and dkdv's Q, dO tiles are read
// both ways and have a 2-way conflict on the column loads.
//
// Expected H200 times: ESTIMATES, no GPU has run these kernels yet. B = 16, H = 12,
// T = 1024, D = 64, causal: 100.7 M (query, key) pairs (B·H·T²/2; the diagonal tiles
// add ~3%). H200 figures used: 132 SMs at 1.98 GHz; mma.sync (not wgmma) sustains about
// 50-60% of the 989 TFLOP/s dense BF16 peak in FA2-class kernels, ~500 BF16 / ~250 TF32;
// shared memory 128 B/clk/SM = 33 TB/s in all; MUFU ex2 16/clk/SM = 4.2 T/s; L2 ~10 TB/s;
// HBM 4.3 TB/s.
//   forward (TILE 32): 2 products x 2·D FLOP a pair = 25.8 GFLOP -> 52 µs BF16, 103 µs
//     TF32 on the tensor cores. Fragments are built from FP32 shared memory by 8-byte
//     pair loads and 4-byte column loads (no ldmatrix: it reads b16 data), 32 B a pair
//     = 3.2 GB -> 97 µs; one ex2 a pair -> 24 µs; K and V re-read per 64-query block
//     from L2: 0.8 GB -> ~80 µs. Binds: shared-memory fragment traffic (BF16) or the
//     tensor cores (TF32): ~100-150 µs BF16, ~130-180 µs TF32.
//   attention_mma_bwd_dot: reads O and dO once (2 x 50 MB) -> ~25 µs, HBM-bound.
//   dkdv (TILE 32 BF16, 16 TF32): 4 products = 51.6 GFLOP -> 103 µs BF16 / 206 µs TF32;
//     64 B of fragment loads a pair (Q, dO as pairs and as columns) = 6.4 GB -> 194 µs;
//     binds: shared memory (BF16), tensor cores + shared memory (TF32).
//   dq (TILE 32 BF16, 16 TF32): 3 products = 38.7 GFLOP -> 77 / 155 µs; 48 B a pair =
//     4.8 GB -> 145 µs; one more ex2 a pair -> 24 µs.
//   backward in all: ~350-450 µs BF16, ~500-650 µs TF32.
// SDPA (FlashAttention-2 / cuDNN, BF16 tensors) at ~330 TFLOP/s forward and ~250
// backward (causal-adjusted) would take ~80 + ~260 µs: fwd+bwd at ~55-75% of its speed in
// BF16 (target: >= 50%). The gap is the FP32 staging (twice SDPA's bytes, no ldmatrix);
// BF16 activations in memory would close most of it. The SIMT kernels they replace take
// ~5 ms forward, ~11 ms backward here (8-10 TFLOP/s, issue 12).
#include "common.cuh"

#ifdef ANDREA_CUDA_EMU
#define amma_smem (emu_dynamic_smem())
#else
extern __shared__ float amma_smem_arr[];
#define amma_smem (amma_smem_arr)
#endif

#define AMMA_WARPS 4
#define AMMA_ROWS 64  // rows per block: 4 warps x 16
#define AMMA_LOG2E 1.4426950408889634f
#define AMMA_LN2 0.6931471805599453f

struct alignas(8) AmmaPair {
    float x, y;
};

__device__ __forceinline__ AmmaPair amma_pair(const float* p) {
    return *reinterpret_cast<const AmmaPair*>(p);
}
__device__ __forceinline__ AmmaPair amma_pair2(float x, float y) {
    AmmaPair r;
    r.x = x;
    r.y = y;
    return r;
}

// P = 0: TF32 operands, m16n8k8.  P = 1: BF16 operands, m16n8k16.
template <int P>
struct Amma;

template <>
struct Amma<0> {
    static constexpr int K = 8;
    // x[c][h]: chunk c < K/8, row g (h = 0) or g + 8 (h = 1).
    static __device__ __forceinline__ void a(unsigned (&r)[4], const AmmaPair (&x)[2][2]) {
        r[0] = f32_to_tf32(x[0][0].x);
        r[1] = f32_to_tf32(x[0][1].x);
        r[2] = f32_to_tf32(x[0][0].y);
        r[3] = f32_to_tf32(x[0][1].y);
    }
    static __device__ __forceinline__ void b(unsigned (&r)[2], const AmmaPair (&y)[2]) {
        r[0] = f32_to_tf32(y[0].x);
        r[1] = f32_to_tf32(y[0].y);
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               const unsigned (&b)[2]) {
        float c[4] = {d[0], d[1], d[2], d[3]};
        mma_tf32_m16n8k8(d, a, b, c);
    }
};

template <>
struct Amma<1> {
    static constexpr int K = 16;
    static __device__ __forceinline__ void a(unsigned (&r)[4], const AmmaPair (&x)[2][2]) {
        r[0] = pack_bf16x2(x[0][0].x, x[0][0].y);
        r[1] = pack_bf16x2(x[0][1].x, x[0][1].y);
        r[2] = pack_bf16x2(x[1][0].x, x[1][0].y);
        r[3] = pack_bf16x2(x[1][1].x, x[1][1].y);
    }
    static __device__ __forceinline__ void b(unsigned (&r)[2], const AmmaPair (&y)[2]) {
        r[0] = pack_bf16x2(y[0].x, y[0].y);
        r[1] = pack_bf16x2(y[1].x, y[1].y);
    }
    static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4],
                                               const unsigned (&b)[2]) {
        float c[4] = {d[0], d[1], d[2], d[3]};
        mma_bf16_m16n8k16(d, a, b, c);
    }
};

// A fragment of rows r0 + g, r0 + g + 8, columns k0.. of a row-major tile (leading
// dimension ld) in shared memory.
template <int P>
__device__ __forceinline__ void amma_a_rows(unsigned (&r)[4], const float* s, int ld, int r0,
                                            int k0, int g, int t) {
    AmmaPair x[2][2];
#pragma unroll
    for (int c = 0; c < Amma<P>::K / 8; ++c) {
        x[c][0] = amma_pair(s + (r0 + g) * ld + k0 + 8 * c + 2 * t);
        x[c][1] = amma_pair(s + (r0 + g + 8) * ld + k0 + 8 * c + 2 * t);
    }
    Amma<P>::a(r, x);
}

// A fragment from accumulator tiles acc[n0 .. n0 + K/8) (16 rows x 8 columns each).
template <int P>
__device__ __forceinline__ void amma_a_acc(unsigned (&r)[4], const float (*acc)[4]) {
    AmmaPair x[2][2];
#pragma unroll
    for (int c = 0; c < Amma<P>::K / 8; ++c) {
        x[c][0] = amma_pair2(acc[c][0], acc[c][1]);
        x[c][1] = amma_pair2(acc[c][2], acc[c][3]);
    }
    Amma<P>::a(r, x);
}

// B fragment of Yᵀ, Y row-major [n][k] in shared memory: B[k][n] = Y[n0 + n][k0 + k].
template <int P>
__device__ __forceinline__ void amma_b_trans(unsigned (&r)[2], const float* s, int ld, int n0,
                                             int k0, int g, int t) {
    AmmaPair y[2];
#pragma unroll
    for (int c = 0; c < Amma<P>::K / 8; ++c) y[c] = amma_pair(s + (n0 + g) * ld + k0 + 8 * c + 2 * t);
    Amma<P>::b(r, y);
}

// B fragment of Y itself, row-major [k][n]: B[k][n] = Y[k0 + k][n0 + n].
template <int P>
__device__ __forceinline__ void amma_b_rows(unsigned (&r)[2], const float* s, int ld, int n0,
                                            int k0, int g, int t) {
    AmmaPair y[2];
#pragma unroll
    for (int c = 0; c < Amma<P>::K / 8; ++c) {
        const float* p = s + (k0 + 8 * c + 2 * t) * ld + n0 + g;
        y[c] = amma_pair2(p[0], p[ld]);
    }
    Amma<P>::b(r, y);
}

// Stages rows r0 .. r0 + rows of a heads view (row r at src + r·ss, D floats) into
// dst[r - r0][0 .. D) (leading dimension ld) with cp.async; rows >= n become zeros.
// `vec`: 16-byte copies (the host checked that every row start is 16-byte aligned).
template <int D>
__device__ __forceinline__ void amma_stage(float* dst, int ld, const float* src, long long ss,
                                           int r0, int rows, int n, int vec) {
    if (vec) {
        for (int e = threadIdx.x; e < rows * (D / 4); e += blockDim.x) {
            int r = e / (D / 4), c = (e % (D / 4)) * 4;
            bool ok = r0 + r < n;
            cp_async_16(dst + r * ld + c, ok ? src + (r0 + r) * ss + c : src, ok ? 16 : 0);
        }
    } else {
        for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
            int r = e / D, c = e % D;
            bool ok = r0 + r < n;
            cp_async_4(dst + r * ld + c, ok ? src + (r0 + r) * ss + c : src, ok ? 4 : 0);
        }
    }
}

// Stages `rows` floats src[r0 ..] (zeros past n) into dst with 4-byte cp.async.
__device__ __forceinline__ void amma_stage_vec(float* dst, const float* src, int r0, int rows,
                                               int n) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        bool ok = r0 + r < n;
        cp_async_4(dst + r, ok ? src + r0 + r : src, ok ? 4 : 0);
    }
}

// Stages the block's 64 rows r0.. of a heads view through shared memory (zeros past n)
// and returns this warp's 16 of them as A fragments, f[kk] for columns kk·K.. (the block
// waits for its copies: everything staged before is landed too).
template <int P, int D>
__device__ __forceinline__ void amma_resident(unsigned (&f)[D / Amma<P>::K][4], const float* src,
                                              long long ss, int r0, int n, int vec) {
    constexpr int MK = Amma<P>::K, LD = D + 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    amma_stage<D>(amma_smem, LD, src, ss, r0, AMMA_ROWS, n, vec);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < D / MK; ++kk)
        amma_a_rows<P>(f[kk], amma_smem, LD, warp * 16, kk * MK, lane >> 2, lane & 3);
    __syncthreads();
}

// Row max / sum over the 4 lanes (t = 0..3) that share a row of an accumulator tile.
__device__ __forceinline__ float amma_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(ANDREA_FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(ANDREA_FULL_MASK, v, 2));
}
__device__ __forceinline__ float amma_quad_sum(float v) {
    v += __shfl_xor_sync(ANDREA_FULL_MASK, v, 1);
    return v + __shfl_xor_sync(ANDREA_FULL_MASK, v, 2);
}

// s = A1·B1ᵀ and u = A2·B2ᵀ over D (A: this warp's resident fragments; B1, B2: TILE
// rows of D in shared memory, leading dimension ld): two 16 x TILE score tiles.
template <int P, int D, int TILE>
__device__ __forceinline__ void amma_scores2(float (&s)[TILE / 8][4], float (&u)[TILE / 8][4],
                                             const unsigned (&a1)[D / Amma<P>::K][4],
                                             const unsigned (&a2)[D / Amma<P>::K][4],
                                             const float* b1, const float* b2, int ld, int g,
                                             int t) {
    constexpr int MK = Amma<P>::K;
#pragma unroll
    for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = 0.0f;
            u[n][e] = 0.0f;
        }
#pragma unroll
    for (int kk = 0; kk < D / MK; ++kk)
#pragma unroll
        for (int n = 0; n < TILE / 8; ++n) {
            unsigned f1[2], f2[2];
            amma_b_trans<P>(f1, b1, ld, n * 8, kk * MK, g, t);
            amma_b_trans<P>(f2, b2, ld, n * 8, kk * MK, g, t);
            Amma<P>::mma(s[n], a1[kk], f1);
            Amma<P>::mma(u[n], a2[kk], f2);
        }
}

// acc += X·Y: X the 16 x TILE accumulator tiles x (reused as A), Y TILE rows of D in
// shared memory (leading dimension ld).
template <int P, int D, int TILE>
__device__ __forceinline__ void amma_acc_product(float (&acc)[D / 8][4], const float (&x)[TILE / 8][4],
                                                 const float* y, int ld, int g, int t) {
    constexpr int MK = Amma<P>::K;
#pragma unroll
    for (int kk = 0; kk < TILE / MK; ++kk) {
        unsigned a[4];
        amma_a_acc<P>(a, x + kk * (MK / 8));
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            unsigned f[2];
            amma_b_rows<P>(f, y, ld, n * 8, kk * MK, g, t);
            Amma<P>::mma(acc[n], a, f);
        }
    }
}

// ---- forward ----------------------------------------------------------------------------

template <int P, int D, int TILE>
__device__ void amma_forward(const float* q, const float* k, const float* v, float* out,
                             float* lse, int H, int Tq, int Tk, long long q_bs, long long q_ss,
                             long long k_bs, long long k_ss, long long v_bs, long long v_ss,
                             long long o_bs, long long o_ss, int pos_offset, float scale,
                             int vec) {
    constexpr int MK = Amma<P>::K, LK = D + 8, LV = D + 4;
    constexpr int STAGE = TILE * (LK + LV);
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * AMMA_ROWS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;

    // Q through shared memory into this warp's fragments (16 rows x D).
    unsigned qa[D / MK][4];
    amma_resident<P, D>(qa, qb, q_ss, q0, Tq, vec);

    int q_last = min(q0 + AMMA_ROWS, Tq) - 1;
    int kend = min(pos_offset + q_last + 1, Tk);
    int tiles = (kend + TILE - 1) / TILE;
    int w0 = q0 + warp * 16;                      // the warp's first query
    int w_lim = pos_offset + min(w0 + 15, Tq - 1);  // its last visible key
    int rows[2] = {w0 + g, w0 + g + 8};
    const float sl2 = scale * AMMA_LOG2E;

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    amma_stage<D>(amma_smem, LK, kb, k_ss, 0, TILE, Tk, vec);
    amma_stage<D>(amma_smem + TILE * LK, LV, vb, v_ss, 0, TILE, Tk, vec);
    cp_async_commit();
    for (int it = 0; it < tiles; ++it) {
        int buf = it & 1, j0 = it * TILE;
        if (it + 1 < tiles) {
            float* next = amma_smem + (buf ^ 1) * STAGE;
            amma_stage<D>(next, LK, kb, k_ss, j0 + TILE, TILE, Tk, vec);
            amma_stage<D>(next + TILE * LK, LV, vb, v_ss, j0 + TILE, TILE, Tk, vec);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* Ks = amma_smem + buf * STAGE;
        const float* Vs = Ks + TILE * LK;
        if (w0 < Tq && j0 <= w_lim) {
            float s[TILE / 8][4];
#pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / MK; ++kk)
#pragma unroll
                for (int n = 0; n < TILE / 8; ++n) {
                    unsigned kf[2];
                    amma_b_trans<P>(kf, Ks, LK, n * 8, kk * MK, g, t);
                    Amma<P>::mma(s[n], qa[kk], kf);
                }
            // Scale (base 2), mask the tiles that straddle the diagonal or the end.
            bool partial = j0 + TILE - 1 > pos_offset + w0 || j0 + TILE > Tk;
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float x = s[n][e] * sl2;
                    if (partial) {
                        int j = j0 + n * 8 + 2 * t + (e & 1);
                        if (j > pos_offset + rows[e >> 1] || j >= Tk) x = -INFINITY;
                    }
                    s[n][e] = x;
                    mx[e >> 1] = fmaxf(mx[e >> 1], x);
                }
            float corr[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float mn = fmaxf(m[i], amma_quad_max(mx[i]));
                // A row that has seen no visible key yet keeps m = -inf (and adds zeros).
                corr[i] = mn == -INFINITY ? 1.0f : exp2f(m[i] - mn);
                m[i] = mn;
                l[i] *= corr[i];
            }
#pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float mi = m[e >> 1];
                    float p = mi == -INFINITY ? 0.0f : exp2f(s[n][e] - mi);
                    s[n][e] = p;
                    l[e >> 1] += p;
                }
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[n][e] *= corr[e >> 1];
            amma_acc_product<P, D, TILE>(o, s, Vs, LV, g, t);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float li = amma_quad_sum(l[i]);
        int r = rows[i];
        if (r >= Tq) continue;
        float inv = 1.0f / li;
        float* orow = out + b * o_bs + r * o_ss + h * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            orow[n * 8 + 2 * t] = o[n][2 * i] * inv;
            orow[n * 8 + 2 * t + 1] = o[n][2 * i + 1] * inv;
        }
        if (t == 0) lse[((long long)b * H + h) * Tq + r] = (m[i] + log2f(li)) * AMMA_LN2;
    }
}

#define AMMA_FWD_ENTRY(NAME, P, D, TILE)                                                           \
    extern "C" __global__ void __launch_bounds__(128)                                              \
        NAME(const float* q, const float* k, const float* v, float* out, float* lse, int H, int Tq, \
             int Tk, int D_, long long q_bs, long long q_ss, long long k_bs, long long k_ss,       \
             long long v_bs, long long v_ss, long long o_bs, long long o_ss, int pos_offset,       \
             float scale, int vec) {                                                               \
        (void)D_;                                                                                  \
        amma_forward<P, D, TILE>(q, k, v, out, lse, H, Tq, Tk, q_bs, q_ss, k_bs, k_ss, v_bs, v_ss, \
                                 o_bs, o_ss, pos_offset, scale, vec);                              \
    }
AMMA_FWD_ENTRY(attention_mma_fwd_tf32_d32, 0, 32, 64)
AMMA_FWD_ENTRY(attention_mma_fwd_tf32_d64, 0, 64, 32)
AMMA_FWD_ENTRY(attention_mma_fwd_tf32_d128, 0, 128, 16)
AMMA_FWD_ENTRY(attention_mma_fwd_bf16_d32, 1, 32, 64)
AMMA_FWD_ENTRY(attention_mma_fwd_bf16_d64, 1, 64, 32)
AMMA_FWD_ENTRY(attention_mma_fwd_bf16_d128, 1, 128, 16)

// ---- backward ---------------------------------------------------------------------------

// dt[b, h, t] = Σ_d dO·O, one warp per row; grid (ceil(T / 4), H, B), block 128.
extern "C" __global__ void __launch_bounds__(128)
    attention_mma_bwd_dot(const float* out, const float* dout, float* dt, int H, int T, int D,
                          long long o_bs, long long o_ss, long long do_bs, long long do_ss) {
    int b = blockIdx.z, h = blockIdx.y, r = blockIdx.x * 4 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= T) return;
    const float* orow = out + b * o_bs + r * o_ss + h * D;
    const float* drow = dout + b * do_bs + r * do_ss + h * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s = fmaf(drow[d], orow[d], s);
    s = warp_sum(s);
    if (lane == 0) dt[((long long)b * H + h) * T + r] = s;
}

// dK, dV of the block's 64 keys, looping over the query tiles that see them.
template <int P, int D, int TILE>
__device__ void amma_backward_dkdv(const float* q, const float* k, const float* v,
                                   const float* dout, const float* lse, const float* dt, float* dk,
                                   float* dv, int H, int T, long long q_bs, long long q_ss,
                                   long long k_bs, long long k_ss, long long v_bs, long long v_ss,
                                   long long do_bs, long long do_ss, long long dk_bs,
                                   long long dk_ss, long long dv_bs, long long dv_ss, float scale,
                                   int vec) {
    constexpr int MK = Amma<P>::K, LD = D + 8;
    constexpr int STAGE = 2 * TILE * LD + 2 * TILE;
    int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * AMMA_ROWS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    const float* dob = dout + b * do_bs + h * D;
    const float* lb = lse + ((long long)b * H + h) * T;
    const float* db = dt + ((long long)b * H + h) * T;

    // K, then V, through shared memory into this warp's fragments.
    unsigned ka[D / MK][4], va[D / MK][4];
    amma_resident<P, D>(ka, kb, k_ss, k0, T, vec);
    amma_resident<P, D>(va, vb, v_ss, k0, T, vec);

    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            dka[n][e] = 0.0f;
            dva[n][e] = 0.0f;
        }
    int w0 = k0 + warp * 16;  // the warp's first key
    int keys[2] = {w0 + g, w0 + g + 8};
    const float sl2 = scale * AMMA_LOG2E;
    int tiles = k0 < T ? (T - k0 + TILE - 1) / TILE : 0;

    auto stage = [&](int it, int buf) {
        float* base = amma_smem + buf * STAGE;
        int t0 = k0 + it * TILE;
        amma_stage<D>(base, LD, qb, q_ss, t0, TILE, T, vec);
        amma_stage<D>(base + TILE * LD, LD, dob, do_ss, t0, TILE, T, vec);
        amma_stage_vec(base + 2 * TILE * LD, lb, t0, TILE, T);
        amma_stage_vec(base + 2 * TILE * LD + TILE, db, t0, TILE, T);
        cp_async_commit();
    };
    if (tiles > 0) stage(0, 0);
    for (int it = 0; it < tiles; ++it) {
        int buf = it & 1, t0 = k0 + it * TILE;
        if (it + 1 < tiles) {
            stage(it + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* Qs = amma_smem + buf * STAGE;
        const float* dOs = Qs + TILE * LD;
        const float* Ls = dOs + TILE * LD;
        const float* Ds = Ls + TILE;
        // Skip when every query of the tile precedes every key of the warp.
        if (w0 < T && t0 + TILE - 1 >= w0) {
            float s[TILE / 8][4], dp[TILE / 8][4];
            amma_scores2<P, D, TILE>(s, dp, ka, va, Qs, dOs, LD, g, t);
            // s becomes Pᵀ, dp becomes dSᵀ (rows: keys, columns: queries).
#pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int c = n * 8 + 2 * t + (e & 1), tq = t0 + c;
                    bool ok = tq >= keys[e >> 1] && tq < T;
                    float p = ok ? exp2f(s[n][e] * sl2 - Ls[c] * AMMA_LOG2E) : 0.0f;
                    s[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - Ds[c]);
                }
            amma_acc_product<P, D, TILE>(dva, s, dOs, LD, g, t);
            amma_acc_product<P, D, TILE>(dka, dp, Qs, LD, g, t);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int j = keys[i];
        if (j >= T) continue;
        float* kr = dk + b * dk_bs + j * dk_ss + h * D;
        float* vr = dv + b * dv_bs + j * dv_ss + h * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            kr[n * 8 + 2 * t] = dka[n][2 * i] * scale;
            kr[n * 8 + 2 * t + 1] = dka[n][2 * i + 1] * scale;
            vr[n * 8 + 2 * t] = dva[n][2 * i];
            vr[n * 8 + 2 * t + 1] = dva[n][2 * i + 1];
        }
    }
}

// dQ of the block's 64 queries, looping over the key tiles they see.
template <int P, int D, int TILE>
__device__ void amma_backward_dq(const float* q, const float* k, const float* v, const float* dout,
                                 const float* lse, const float* dt, float* dq, int H, int T,
                                 long long q_bs, long long q_ss, long long k_bs, long long k_ss,
                                 long long v_bs, long long v_ss, long long do_bs, long long do_ss,
                                 long long dq_bs, long long dq_ss, float scale, int vec) {
    constexpr int MK = Amma<P>::K, LD = D + 8;
    constexpr int STAGE = 2 * TILE * LD;
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * AMMA_ROWS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    const float* dob = dout + b * do_bs + h * D;
    const float* lb = lse + ((long long)b * H + h) * T;
    const float* db = dt + ((long long)b * H + h) * T;

    unsigned qa[D / MK][4], oa[D / MK][4];
    amma_resident<P, D>(qa, qb, q_ss, q0, T, vec);
    amma_resident<P, D>(oa, dob, do_ss, q0, T, vec);

    int w0 = q0 + warp * 16;
    int rows[2] = {w0 + g, w0 + g + 8};
    float L[2], Dt[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        bool ok = rows[i] < T;
        L[i] = ok ? lb[rows[i]] * AMMA_LOG2E : 0.0f;
        Dt[i] = ok ? db[rows[i]] : 0.0f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
    const float sl2 = scale * AMMA_LOG2E;
    int kend = min(q0 + AMMA_ROWS, T);
    int tiles = (kend + TILE - 1) / TILE;
    int w_last = min(w0 + 15, T - 1);

    auto stage = [&](int it, int buf) {
        float* base = amma_smem + buf * STAGE;
        amma_stage<D>(base, LD, kb, k_ss, it * TILE, TILE, T, vec);
        amma_stage<D>(base + TILE * LD, LD, vb, v_ss, it * TILE, TILE, T, vec);
        cp_async_commit();
    };
    stage(0, 0);
    for (int it = 0; it < tiles; ++it) {
        int buf = it & 1, j0 = it * TILE;
        if (it + 1 < tiles) {
            stage(it + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* Ks = amma_smem + buf * STAGE;
        const float* Vs = Ks + TILE * LD;
        if (w0 < T && j0 <= w_last) {
            float s[TILE / 8][4], dp[TILE / 8][4];
            amma_scores2<P, D, TILE>(s, dp, qa, oa, Ks, Vs, LD, g, t);
#pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int j = j0 + n * 8 + 2 * t + (e & 1), i = e >> 1;
                    bool ok = j <= rows[i] && j < T;
                    float p = ok ? exp2f(s[n][e] * sl2 - L[i]) : 0.0f;
                    dp[n][e] = p * (dp[n][e] - Dt[i]);
                }
            amma_acc_product<P, D, TILE>(acc, dp, Ks, LD, g, t);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int r = rows[i];
        if (r >= T) continue;
        float* row = dq + b * dq_bs + r * dq_ss + h * D;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            row[n * 8 + 2 * t] = acc[n][2 * i] * scale;
            row[n * 8 + 2 * t + 1] = acc[n][2 * i + 1] * scale;
        }
    }
}

#define AMMA_BWD_ENTRIES(SUFFIX, P, D, TILE)                                                       \
    extern "C" __global__ void __launch_bounds__(128) attention_mma_bwd_dkdv_##SUFFIX(            \
        const float* q, const float* k, const float* v, const float* dout, const float* lse,        \
        const float* dt, float* dk, float* dv, int H, int T, long long q_bs, long long q_ss,        \
        long long k_bs, long long k_ss, long long v_bs, long long v_ss, long long do_bs,            \
        long long do_ss, long long dk_bs, long long dk_ss, long long dv_bs, long long dv_ss,        \
        float scale, int vec) {                                                                     \
        amma_backward_dkdv<P, D, TILE>(q, k, v, dout, lse, dt, dk, dv, H, T, q_bs, q_ss, k_bs,      \
                                       k_ss, v_bs, v_ss, do_bs, do_ss, dk_bs, dk_ss, dv_bs, dv_ss,  \
                                       scale, vec);                                                 \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128) attention_mma_bwd_dq_##SUFFIX(              \
        const float* q, const float* k, const float* v, const float* dout, const float* lse,        \
        const float* dt, float* dq, int H, int T, long long q_bs, long long q_ss, long long k_bs,   \
        long long k_ss, long long v_bs, long long v_ss, long long do_bs, long long do_ss,           \
        long long dq_bs, long long dq_ss, float scale, int vec) {                                   \
        amma_backward_dq<P, D, TILE>(q, k, v, dout, lse, dt, dq, H, T, q_bs, q_ss, k_bs, k_ss,      \
                                     v_bs, v_ss, do_bs, do_ss, dq_bs, dq_ss, scale, vec);           \
    }
// TF32 with D = 128 has no backward here: its K, V fragments and dK, dV accumulators
// alone are 256 registers (plan::attention keeps the SIMT backward for it).
AMMA_BWD_ENTRIES(tf32_d32, 0, 32, 64)
AMMA_BWD_ENTRIES(tf32_d64, 0, 64, 16)
AMMA_BWD_ENTRIES(bf16_d32, 1, 32, 64)
AMMA_BWD_ENTRIES(bf16_d64, 1, 64, 32)
AMMA_BWD_ENTRIES(bf16_d128, 1, 128, 16)

#undef amma_smem
