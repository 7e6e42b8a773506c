// Row softmax with an optional causal mask, and its backward, one warp per row.
//
//   forward:  row r of x: [.., Tq, Tk] is query i = r mod Tq; it sees columns j < n with
//             n = min(offset + i + 1, Tk) when causal, else Tk.
//             out[j] = exp(scale·x[j] - m) / Σ_{j'<n} exp(scale·x[j'] - m) for j < n,
//             m = max_{j<n} scale·x[j]; out[j] = 0 for j >= n.
//             One pass keeps an online (max, sum) pair per lane, merged by shuffles;
//             a second pass writes. out may be exactly x (each element is read and then
//             written by the same lane).
//   backward: dx[j] = scale·p[j]·(dp[j] - Σ_j' p[j']·dp[j']); dx may be exactly dp.
//
// Launch: block 256 = 8 warps = 8 rows, grid ceil(rows / 8) (plan::rows). Lane l takes
// columns l, l+32, ...: each warp access is 128 contiguous bytes.
#include "common.cuh"

extern "C" __global__ void softmax_forward(const float* x, float* out, int rows, int q_len, int k_len,
                                           float scale, int causal, int offset) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long long base = (long long)row * k_len;
    int n = k_len;
    if (causal) n = min(offset + (row % q_len) + 1, k_len);
    float m = -INFINITY, s = 0.0f;
    for (int j = lane; j < n; j += 32) {
        float v = scale * x[base + j];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    warp_online_merge(m, s);
    float inv = 1.0f / s;
    for (int j = lane; j < k_len; j += 32) {
        out[base + j] = (j < n) ? expf(scale * x[base + j] - m) * inv : 0.0f;
    }
}

extern "C" __global__ void softmax_backward(const float* p, const float* dp, float* dx, int rows, int k,
                                            float scale) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long long base = (long long)row * k;
    float dot = 0.0f;
    for (int j = lane; j < k; j += 32) dot += p[base + j] * dp[base + j];
    dot = warp_sum(dot);
    for (int j = lane; j < k; j += 32) dx[base + j] = scale * p[base + j] * (dp[base + j] - dot);
}
