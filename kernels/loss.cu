// Fused softmax + cross-entropy over rows of `vp` logits of which the first `vocab` are
// real (the rest is padding with gradient 0):
//
//   loss[n]    = m + log Σ_{j<vocab} exp(x[j] - m) - x[target],  m = max_{j<vocab} x[j]
//   dlogits[n] = grad_scale·(softmax(x)[j] - [j == target]) for j < vocab, 0 for j >= vocab
//   target == IGNORE_INDEX (u32::MAX): loss 0 and a zero gradient row.
//
// Launch: one block of 256 threads per row, grid = rows (plan::rows::cross_entropy).
// Pass 1: each thread keeps an online (max, sum) over columns tid, tid+256, ...; warps
// merge by shuffles, then warp 0 merges the 8 warp results (fixed order). x[target] is
// read before the barrier that precedes pass 2, so dlogits may be exactly logits: in
// pass 2 each element is read and then overwritten by the same thread.
#include "common.cuh"

#define IGNORE_INDEX 0xffffffffu

extern "C" __global__ void softmax_cross_entropy(const float* logits, const unsigned* targets,
                                                 float* losses, float* dlogits, int vocab, int vp,
                                                 float grad_scale) {
    __shared__ float sm[32], ss[32];
    __shared__ float stats[2];
    long long base = (long long)blockIdx.x * vp;
    const float* x = logits + base;
    unsigned target = targets[blockIdx.x];
    bool ignore = (target == IGNORE_INDEX);
    float m = -INFINITY, s = 0.0f;
    if (!ignore) {
        for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
            float v = x[j];
            if (v > m) {
                s = s * expf(m - v) + 1.0f;
                m = v;
            } else {
                s += expf(v - m);
            }
        }
    }
    warp_online_merge(m, s);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sm[w] = m;
        ss[w] = s;
    }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? sm[lane] : -INFINITY;
        s = lane < nw ? ss[lane] : 0.0f;
        warp_online_merge(m, s);
        if (lane == 0) {
            stats[0] = m;
            stats[1] = s;
            float loss = 0.0f;
            if (!ignore && target < (unsigned)vocab) loss = m + logf(s) - x[target];
            losses[blockIdx.x] = loss;
        }
    }
    __syncthreads();
    if (dlogits == nullptr) return;
    float* d = dlogits + base;
    if (ignore) {
        for (int j = threadIdx.x; j < vp; j += blockDim.x) d[j] = 0.0f;
        return;
    }
    float mx = stats[0], k = grad_scale / stats[1];
    for (int j = threadIdx.x; j < vp; j += blockDim.x) {
        float g = 0.0f;
        if (j < vocab) {
            g = expf(x[j] - mx) * k;
            if (j == (int)target) g -= grad_scale;
        }
        d[j] = g;
    }
}
