// Fused causal multi-head attention, forward and backward. Query t (absolute position
// pos_offset + t) sees keys j <= pos_offset + t. scale = 1/sqrt(D). Element (b, t, h, d)
// of q, k, v, out (and their gradients) is at b·bs + t·ss + h·D + d.
//
// Forward (online softmax, never a T×T matrix in memory):
//   for each key tile of 32:  s_j = scale·q·k_j,  m' = max(m, max_j s_j),
//     l = l·e^(m - m') + Σ_j e^(s_j - m'),  o = o·e^(m - m') + Σ_j e^(s_j - m')·v_j
//   out = o / l, lse = m + log l  (kept: [B, H, Tq], the only workspace).
//   Launch attention_forward_r4 (R = 4): grid (ceil(Tq / 4R), H, B), block 128 = 4 warps,
//   each warp owning R query rows of the block's 4R (R = 4 fits every D <= 128). Dynamic shared memory (plan::attention)
//   holds Q (pre-scaled) [4R][D], a K tile [32][D+1] (padded: lane j reads row j) and a
//   V tile [32][D]. Lane j scores key j of the tile; the output row is spread over the
//   lanes (d = lane + 32·c, c < 4, so D <= 128), and the probabilities are broadcast by
//   shuffles. Tiles past the block's last visible key are never loaded.
//
// Backward (training: pos_offset = 0, Tq = Tk = T), recomputing P = exp(S - lse):
//   D_t = Σ_d dO_t·O_t,  dP_tj = dO_t·v_j,  dS_tj = P_tj·(dP_tj - D_t)
//   dq_t = scale·Σ_j dS_tj·k_j       dk_j = scale·Σ_t dS_tj·q_t       dv_j = Σ_t P_tj·dO_t
//   attention_backward_dq_r<R>: the forward's layout (grid (ceil(T / 4R), H, B), block
//     128), with dO rows beside Q and a padded V tile; writes dq (=).
//   attention_backward_dkdv: one warp per block owning 32 keys and a slice of 32 of the
//     D dimensions of their dk, dv rows (held in registers: 64 per lane); it walks the
//     queries t >= the tile's first key in order, staging q_t and dO_t in shared memory.
//     Grid (ceil(T / 32), H·ceil(D / 32), B). Every sum runs in a fixed order and each
//     output element has one writer: no atomics, bit-identical runs. The slices repeat
//     the score computation ceil(D / 32) times; the price of keeping dk, dv out of
//     shared memory and atomics (to revisit with measurements on a GPU).
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_MAX_D 128

// Dynamic shared memory of every kernel in this file (sizes from plan::attention).
#ifdef ANDREA_CUDA_EMU
#define smem (emu_dynamic_smem())
#else
extern __shared__ float smem[];
#endif

template <int R>
__device__ void att_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                            int H, int Tq, int Tk, int D, long long q_bs, long long q_ss,
                            long long k_bs, long long k_ss, long long v_bs, long long v_ss,
                            long long o_bs, long long o_ss, int pos_offset, float scale) {
    const int BQ = ATT_WARPS * R;
    float* Qs = smem;
    float* Ks = Qs + BQ * D;
    float* Vs = Ks + 32 * (D + 1);
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
        int r = e / D, d = e % D, t = q0 + r;
        Qs[e] = t < Tq ? qb[t * q_ss + d] * scale : 0.0f;
    }
    int q_last = min(q0 + BQ, Tq) - 1;
    int kend = min(pos_offset + q_last + 1, Tk);

    float m[R], l[R], o[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) o[i][c] = 0.0f;
    }
    for (int j0 = 0; j0 < kend; j0 += 32) {
        __syncthreads();
        for (int e = threadIdx.x; e < 32 * D; e += blockDim.x) {
            int jj = e / D, d = e % D, j = j0 + jj;
            bool ok = j < Tk;
            Ks[jj * (D + 1) + d] = ok ? kb[j * k_ss + d] : 0.0f;
            Vs[jj * D + d] = ok ? vb[j * v_ss + d] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < R; ++i) {
            int r = warp * R + i, t = q0 + r;
            int lim = pos_offset + t;
            if (t >= Tq || j0 > lim) continue;
            int j = j0 + lane;
            const float* qr = Qs + r * D;
            const float* kr = Ks + lane * (D + 1);
            float s = 0.0f;
            for (int d = 0; d < D; ++d) s = fmaf(qr[d], kr[d], s);
            bool ok = j <= lim && j < Tk;
            s = ok ? s : -INFINITY;
            float mn = fmaxf(m[i], warp_max(s));
            float p = ok ? expf(s - mn) : 0.0f;
            float corr = expf(m[i] - mn);
            l[i] = l[i] * corr + warp_sum(p);
            m[i] = mn;
#pragma unroll
            for (int c = 0; c < 4; ++c) o[i][c] *= corr;
#pragma unroll 8
            for (int jj = 0; jj < 32; ++jj) {
                float pj = __shfl_sync(ANDREA_FULL_MASK, p, jj);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    int d = lane + 32 * c;
                    if (d < D) o[i][c] = fmaf(pj, Vs[jj * D + d], o[i][c]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int t = q0 + warp * R + i;
        if (t >= Tq) continue;
        float inv = 1.0f / l[i];
        float* orow = out + b * o_bs + t * o_ss + h * D;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            int d = lane + 32 * c;
            if (d < D) orow[d] = o[i][c] * inv;
        }
        if (lane == 0) lse[((long long)b * H + h) * Tq + t] = m[i] + logf(l[i]);
    }
}

#define ATT_FWD_ENTRY(R)                                                                           \
    extern "C" __global__ void __launch_bounds__(128) attention_forward_r##R(                       \
        const float* q, const float* k, const float* v, float* out, float* lse, int H, int Tq,      \
        int Tk, int D, long long q_bs, long long q_ss, long long k_bs, long long k_ss,              \
        long long v_bs, long long v_ss, long long o_bs, long long o_ss, int pos_offset,             \
        float scale) {                                                                              \
        att_forward<R>(q, k, v, out, lse, H, Tq, Tk, D, q_bs, q_ss, k_bs, k_ss, v_bs, v_ss, o_bs,   \
                       o_ss, pos_offset, scale);                                                    \
    }
ATT_FWD_ENTRY(4)

// Σ_d dO_t·O_t by one warp.
__device__ __forceinline__ float row_dot(const float* a, const float* b, int D, int lane) {
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s = fmaf(a[d], b[d], s);
    return warp_sum(s);
}

template <int R>
__device__ void att_backward_dq(const float* q, const float* k, const float* v, const float* out,
                                const float* dout, const float* lse, float* dq, int H, int T, int D,
                                long long q_bs, long long q_ss, long long k_bs, long long k_ss,
                                long long v_bs, long long v_ss, long long o_bs, long long o_ss,
                                long long do_bs, long long do_ss, long long dq_bs, long long dq_ss,
                                float scale) {
    const int BQ = ATT_WARPS * R;
    float* Qs = smem;
    float* dOs = Qs + BQ * D;
    float* Ks = dOs + BQ * D;
    float* Vs = Ks + 32 * (D + 1);
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * BQ;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    const float* ob = out + b * o_bs + h * D;
    const float* dob = dout + b * do_bs + h * D;
    const float* lb = lse + ((long long)b * H + h) * T;
    for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
        int r = e / D, d = e % D, t = q0 + r;
        Qs[e] = t < T ? qb[t * q_ss + d] * scale : 0.0f;
        dOs[e] = t < T ? dob[t * do_ss + d] : 0.0f;
    }
    float di[R], L[R], acc[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int t = q0 + warp * R + i;
        di[i] = 0.0f;
        L[i] = 0.0f;
        if (t < T) {
            di[i] = row_dot(dob + t * do_ss, ob + t * o_ss, D, lane);
            L[i] = lb[t];
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
    }
    int kend = min(q0 + BQ, T);
    for (int j0 = 0; j0 < kend; j0 += 32) {
        __syncthreads();
        for (int e = threadIdx.x; e < 32 * D; e += blockDim.x) {
            int jj = e / D, d = e % D, j = j0 + jj;
            bool ok = j < T;
            Ks[jj * (D + 1) + d] = ok ? kb[j * k_ss + d] : 0.0f;
            Vs[jj * (D + 1) + d] = ok ? vb[j * v_ss + d] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < R; ++i) {
            int r = warp * R + i, t = q0 + r;
            if (t >= T || j0 > t) continue;
            int j = j0 + lane;
            const float* qr = Qs + r * D;
            const float* dr = dOs + r * D;
            const float* kr = Ks + lane * (D + 1);
            const float* vr = Vs + lane * (D + 1);
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; ++d) {
                s = fmaf(qr[d], kr[d], s);
                dp = fmaf(dr[d], vr[d], dp);
            }
            float p = (j <= t && j < T) ? expf(s - L[i]) : 0.0f;
            float ds = p * (dp - di[i]);
#pragma unroll 8
            for (int jj = 0; jj < 32; ++jj) {
                float dsj = __shfl_sync(ANDREA_FULL_MASK, ds, jj);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    int d = lane + 32 * c;
                    if (d < D) acc[i][c] = fmaf(dsj, Ks[jj * (D + 1) + d], acc[i][c]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int t = q0 + warp * R + i;
        if (t >= T) continue;
        float* row = dq + b * dq_bs + t * dq_ss + h * D;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            int d = lane + 32 * c;
            if (d < D) row[d] = acc[i][c] * scale;
        }
    }
}

#define ATT_DQ_ENTRY(R)                                                                             \
    extern "C" __global__ void __launch_bounds__(128) attention_backward_dq_r##R(                    \
        const float* q, const float* k, const float* v, const float* out, const float* dout,         \
        const float* lse, float* dq, int H, int T, int D, long long q_bs, long long q_ss,            \
        long long k_bs, long long k_ss, long long v_bs, long long v_ss, long long o_bs,              \
        long long o_ss, long long do_bs, long long do_ss, long long dq_bs, long long dq_ss,          \
        float scale) {                                                                               \
        att_backward_dq<R>(q, k, v, out, dout, lse, dq, H, T, D, q_bs, q_ss, k_bs, k_ss, v_bs, v_ss, \
                           o_bs, o_ss, do_bs, do_ss, dq_bs, dq_ss, scale);                           \
    }
ATT_DQ_ENTRY(4)
ATT_DQ_ENTRY(2)

extern "C" __global__ void __launch_bounds__(32) attention_backward_dkdv(
    const float* q, const float* k, const float* v, const float* out, const float* dout,
    const float* lse, float* dk, float* dv, int H, int T, int D, long long q_bs, long long q_ss,
    long long k_bs, long long k_ss, long long v_bs, long long v_ss, long long o_bs, long long o_ss,
    long long do_bs, long long do_ss, long long dk_bs, long long dk_ss, long long dv_bs,
    long long dv_ss, float scale) {
    float* Ks = smem;
    float* Vs = Ks + 32 * (D + 1);
    float* qs = Vs + 32 * (D + 1);
    float* dos = qs + D;
    int slices = (D + 31) / 32;
    int b = blockIdx.z, h = blockIdx.y / slices, slice = blockIdx.y % slices;
    int lane = threadIdx.x, k0 = blockIdx.x * 32, j = k0 + lane;
    const float* qb = q + b * q_bs + h * D;
    const float* kb = k + b * k_bs + h * D;
    const float* vb = v + b * v_bs + h * D;
    const float* ob = out + b * o_bs + h * D;
    const float* dob = dout + b * do_bs + h * D;
    const float* lb = lse + ((long long)b * H + h) * T;
    for (int e = lane; e < 32 * D; e += 32) {
        int jj = e / D, d = e % D, jk = k0 + jj;
        bool ok = jk < T;
        Ks[jj * (D + 1) + d] = ok ? kb[jk * k_ss + d] : 0.0f;
        Vs[jj * (D + 1) + d] = ok ? vb[jk * v_ss + d] : 0.0f;
    }
    float dka[32], dva[32];
#pragma unroll
    for (int dd = 0; dd < 32; ++dd) {
        dka[dd] = 0.0f;
        dva[dd] = 0.0f;
    }
    const float* kr = Ks + lane * (D + 1);
    const float* vr = Vs + lane * (D + 1);
    int d0 = slice * 32;
    for (int t = k0; t < T; ++t) {
        __syncwarp();
        for (int d = lane; d < D; d += 32) {
            qs[d] = qb[t * q_ss + d];
            dos[d] = dob[t * do_ss + d];
        }
        float di = row_dot(dob + t * do_ss, ob + t * o_ss, D, lane);
        float L = lb[t];
        __syncwarp();
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; ++d) {
            s = fmaf(qs[d], kr[d], s);
            dp = fmaf(dos[d], vr[d], dp);
        }
        float p = (j <= t && j < T) ? expf(s * scale - L) : 0.0f;
        float ds = p * (dp - di);
#pragma unroll
        for (int dd = 0; dd < 32; ++dd) {
            int d = d0 + dd;
            if (d < D) {
                dva[dd] = fmaf(p, dos[d], dva[dd]);
                dka[dd] = fmaf(ds, qs[d], dka[dd]);
            }
        }
    }
    if (j >= T) return;
    float* dkr = dk + b * dk_bs + j * dk_ss + h * D;
    float* dvr = dv + b * dv_bs + j * dv_ss + h * D;
#pragma unroll
    for (int dd = 0; dd < 32; ++dd) {
        int d = d0 + dd;
        if (d < D) {
            dkr[d] = dka[dd] * scale;
            dvr[d] = dva[dd];
        }
    }
}

#ifdef ANDREA_CUDA_EMU
#undef smem
#endif
