// Split-KV ("flash-decoding") attention forward for generation with a KV cache: a few
// query rows (Tq <= 4) against a long key cache. The same math and conventions as
// kernels/attention.cu: query t (absolute position pos_offset + t) sees keys
// j <= pos_offset + t, scale = 1/sqrt(D), element (b, t, h, d) of a heads view at
// b·bs + t·ss + h·D + d, lse[(b·H + h)·Tq + t] = log Σ_j exp(scale·q_t·k_j). FP32
// arithmetic throughout: the kernels are bound by reading the cache, so tensor cores
// would gain nothing, and every precision (FP32, TF32, BF16) runs them at the FP32
// tolerance.
//
// Why: the row-tiled forwards run one block per (query tile, head, batch). At Tq = 1 that
// is B·H blocks (12 at batch 1 on 132 SMs), each walking the whole cache alone, with 15
// of the SIMT kernel's 16 rows (63 of the mma kernel's 64) empty.
//
// attention_decode_split: the keys [0, Tk) are cut into N chunks of L keys (L a multiple
//   of 32; plan::attention::decode_chunks picks N from Tk, B·H and the SM count). Grid
//   (ceil(N / 4), H, B), block 128 = 4 warps; warp w of block x owns chunk c = 4x + w,
//   keys [c·L, min((c+1)·L, Tk)). Q (pre-scaled, [Tq][D]) is staged in shared memory.
//   Per 32-key tile, lane j scores key j for every row (its K row read from global,
//   contiguous per lane), then per row i
//     m' = max(m, max_j s_ij),  p_ij = e^(s_ij - m'),  l = l·e^(m - m') + Σ_j p_ij,
//     o = o·e^(m - m') + Σ_j p_ij·v_j   (o spread over the lanes: d = lane + 32·c),
//   each V row read once for all rows (coalesced), p broadcast by shuffles. A row whose
//   visible keys end before the tile skips it, so a chunk a row cannot see leaves the
//   partial (m, l, o) = (-inf, 0, 0). Partials go to the workspace, after the lse:
//   ml[2·(r·N + c) + {0, 1}] = (m, l) and po[(r·N + c)·D + d] = o, r = (b·H + h)·Tq + t.
// attention_decode_combine: one warp per row r (grid ceil(B·H·Tq / 4), block 128), the
//   chunks merged in the order c = 0, 1, ..., N-1 (no atomics, bit-identical runs):
//     M = max_c m_c,  w_c = e^(m_c - M) (0 for an empty chunk),  L = Σ_c w_c·l_c,
//     out = Σ_c w_c·o_c / L,  lse = M + log L.
//
// Expected H200 time: ESTIMATES, no GPU has run these kernels. Bytes are K and V of the
// visible cache (2·B·H·Tk·D·4), read once; the partials are Tq·N·(D+2) floats a head
// (< 1% of that here) and the combine is one more launch. H200: 4.3 TB/s HBM, 132 SMs,
// ~3-5 µs for a launch plus its first loads. D = 64, H = 12, Tk = 1024, Tq = 1:
//   B = 1:  6.3 MB -> 1.5 µs at 4.3 TB/s; N = 32 chunks of 32 keys, 384 warps (~3 per
//           SM: too few loads in flight to reach the peak), so latency binds: two
//           launches, ~6-10 µs in all. The unsplit SIMT forward runs 12 blocks that each
//           walk 32 tiles with a load, two reductions and 32 shuffles per tile:
//           ~30-60 µs; the unsplit mma forward about the same (12 blocks, 64-row tiles).
//   B = 16: 101 MB -> 23 µs at 4.3 TB/s; N = 6 chunks of 192 keys, 1152 warps (~9 per
//           SM); binds: HBM, ~30 µs with the combine. Unsplit: 192 blocks of 4 warps on
//           132 SMs, each block's 4 warps on one 16-row tile, about 1.5 blocks an SM
//           and 15/16 of the score work wasted: ~60-100 µs.
// The GPU bundle's `gpu_check decode` rows time both (split, and ANDREA_CUDA_DECODE=off).
#include "common.cuh"

#define DEC_WARPS 4
#define DEC_MAX_ROWS 4
#define DEC_MAX_D 128

// fault (tests only): 1 = each chunk reads one key past its end (a boundary off by one:
// the key after each inner boundary is counted twice); 2 = the combine drops the last chunk.
extern "C" __global__ void __launch_bounds__(128) attention_decode_split(
    const float* q, const float* k, const float* v, float* ml, float* po, int H, int Tq, int Tk,
    int D, long long q_bs, long long q_ss, long long k_bs, long long k_ss, long long v_bs,
    long long v_ss, int pos_offset, float scale, int L, int N, int fault) {
    __shared__ float Qs[DEC_MAX_ROWS * DEC_MAX_D];
    int b = blockIdx.z, h = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qb = q + b * q_bs + h * D;
    for (int e = threadIdx.x; e < Tq * D; e += blockDim.x) {
        int t = e / D, d = e % D;
        Qs[e] = qb[t * q_ss + d] * scale;
    }
    __syncthreads();
    int c = blockIdx.x * DEC_WARPS + warp;
    if (c >= N) return;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    int j_begin = c * L;
    int j_end = min(j_begin + L + (fault == 1 ? 1 : 0), Tk);

    float m[DEC_MAX_ROWS], l[DEC_MAX_ROWS], o[DEC_MAX_ROWS][4];
#pragma unroll
    for (int i = 0; i < DEC_MAX_ROWS; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) o[i][cc] = 0.0f;
    }
    for (int j0 = j_begin; j0 < j_end; j0 += 32) {
        int j = j0 + lane;
        bool in = j < j_end;
        float s[DEC_MAX_ROWS] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (in) {
            const float* kr = kb + j * k_ss;
            for (int d = 0; d < D; ++d) {
                float kd = kr[d];
#pragma unroll
                for (int i = 0; i < DEC_MAX_ROWS; ++i)
                    if (i < Tq) s[i] = fmaf(Qs[i * D + d], kd, s[i]);
            }
        }
        // The keys of this tile any row sees: [j0, j0 + nk).
        int nk = min(min(32, j_end - j0), pos_offset + Tq - j0);
        float p[DEC_MAX_ROWS];
#pragma unroll
        for (int i = 0; i < DEC_MAX_ROWS; ++i) {
            p[i] = 0.0f;
            int lim = pos_offset + i;  // row i's last visible key
            if (i >= Tq || j0 > lim) continue;  // the same for the whole warp
            bool ok = in && j <= lim;
            float si = ok ? s[i] : -INFINITY;
            float mn = fmaxf(m[i], warp_max(si));  // finite: key j0 is visible
            p[i] = ok ? expf(si - mn) : 0.0f;
            float corr = expf(m[i] - mn);  // 0 on the first visible tile
            l[i] = l[i] * corr + warp_sum(p[i]);
            m[i] = mn;
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) o[i][cc] *= corr;
        }
        for (int jj = 0; jj < nk; ++jj) {
            const float* vr = vb + (long long)(j0 + jj) * v_ss;
            float vd[4];
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                int d = lane + 32 * cc;
                vd[cc] = d < D ? vr[d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < DEC_MAX_ROWS; ++i) {
                if (i >= Tq) continue;
                float pj = __shfl_sync(ANDREA_FULL_MASK, p[i], jj);
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) o[i][cc] = fmaf(pj, vd[cc], o[i][cc]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < DEC_MAX_ROWS; ++i) {
        if (i >= Tq) continue;
        long long idx = (((long long)b * H + h) * Tq + i) * N + c;
        if (lane == 0) {
            ml[2 * idx] = m[i];
            ml[2 * idx + 1] = l[i];
        }
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
            int d = lane + 32 * cc;
            if (d < D) po[idx * D + d] = o[i][cc];
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) attention_decode_combine(
    const float* ml, const float* po, float* out, float* lse, int H, int Tq, int D, int N,
    long long o_bs, long long o_ss, int rows, int fault) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * DEC_WARPS + warp;
    if (r >= rows) return;
    int t = r % Tq, bh = r / Tq, h = bh % H, b = bh / H;
    int n = fault == 2 ? N - 1 : N;
    const float* mlr = ml + 2 * (long long)r * N;
    const float* por = po + (long long)r * N * D;
    float M = -INFINITY;
    for (int c = 0; c < n; ++c) M = fmaxf(M, mlr[2 * c]);
    float L = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c = 0; c < n; ++c) {
        float mc = mlr[2 * c];
        float w = mc == -INFINITY ? 0.0f : expf(mc - M);
        L = fmaf(w, mlr[2 * c + 1], L);
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
            int d = lane + 32 * cc;
            if (d < D) acc[cc] = fmaf(w, por[(long long)c * D + d], acc[cc]);
        }
    }
    float inv = 1.0f / L;
    float* orow = out + b * o_bs + t * o_ss + h * D;
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
        int d = lane + 32 * cc;
        if (d < D) orow[d] = acc[cc] * inv;
    }
    if (lane == 0) lse[r] = M + logf(L);
}
