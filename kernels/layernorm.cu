// LayerNorm over the last dimension, forward and backward, one warp per row.
//
//   forward:  mean = Σx/C, var = Σ(x - mean)²/C (biased, two passes over the row),
//             rstd = 1/sqrt(var + eps), out = γ·(x - mean)·rstd + β; saves mean, rstd.
//   residual: residual = a + b first (written in pass 1, re-read by the same lane in
//             passes 2 and 3, so residual may be exactly a or b), then LayerNorm of it.
//   backward: x̂ = (x - mean)·rstd, g = dout·γ,
//             dx += rstd·(g - mean(g) - x̂·mean(g·x̂))          (one warp per row)
//             dγ += Σ_rows dout·x̂, dβ += Σ_rows dout          (layernorm_param_partials
//             writes per-chunk column sums; bias.cu's column_finish adds them in order)
//
// Launch (row kernels): block 256 = 8 warps = 8 rows, grid ceil(rows / 8). VEC 4 reads
// rows as float4 when C ≡ 0 mod 4 and every pointer is 16-byte aligned (plan::rows).
// Lane l handles elements (or float4 groups) l, l+32, ... of its row in every pass.
// layernorm_param_partials: grid (ceil(C / 256), chunks), block 256, as column_partials.
#include "common.cuh"

__device__ __forceinline__ float4 f4_add(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <int VEC, bool RESID>
__device__ void ln_forward(const float* a, const float* b, float* residual, const float* x_in,
                           const float* gamma, const float* beta, float* out, float* mean,
                           float* rstd, int rows, int C, float eps) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long long base = (long long)row * C;
    const float* x = RESID ? residual + base : x_in + base;
    float* o = out + base;
    float s = 0.0f;
    if (VEC == 4) {
        int n4 = C / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (int i = lane; i < n4; i += 32) {
            float4 v;
            if (RESID) {
                v = f4_add(reinterpret_cast<const float4*>(a + base)[i],
                           reinterpret_cast<const float4*>(b + base)[i]);
                reinterpret_cast<float4*>(residual + base)[i] = v;
            } else {
                v = x4[i];
            }
            s += (v.x + v.y) + (v.z + v.w);
        }
        float mu = warp_sum(s) / C;
        float q = 0.0f;
        for (int i = lane; i < n4; i += 32) {
            float4 v = x4[i];
            float d0 = v.x - mu, d1 = v.y - mu, d2 = v.z - mu, d3 = v.w - mu;
            q += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
        }
        float r = 1.0f / sqrtf(warp_sum(q) / C + eps);
        const float4* g4 = reinterpret_cast<const float4*>(gamma);
        const float4* b4 = reinterpret_cast<const float4*>(beta);
        float4* o4 = reinterpret_cast<float4*>(o);
        for (int i = lane; i < n4; i += 32) {
            float4 v = x4[i], g = g4[i], bb = b4[i];
            o4[i] = make_float4((v.x - mu) * r * g.x + bb.x, (v.y - mu) * r * g.y + bb.y,
                                (v.z - mu) * r * g.z + bb.z, (v.w - mu) * r * g.w + bb.w);
        }
        if (lane == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    } else {
        for (int i = lane; i < C; i += 32) {
            float v;
            if (RESID) {
                v = a[base + i] + b[base + i];
                residual[base + i] = v;
            } else {
                v = x[i];
            }
            s += v;
        }
        float mu = warp_sum(s) / C;
        float q = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float d = x[i] - mu;
            q += d * d;
        }
        float r = 1.0f / sqrtf(warp_sum(q) / C + eps);
        for (int i = lane; i < C; i += 32) o[i] = (x[i] - mu) * r * gamma[i] + beta[i];
        if (lane == 0) {
            mean[row] = mu;
            rstd[row] = r;
        }
    }
}

extern "C" __global__ void layernorm_forward_v1(const float* x, const float* gamma, const float* beta,
                                                float* out, float* mean, float* rstd, int rows, int C,
                                                float eps) {
    ln_forward<1, false>(nullptr, nullptr, nullptr, x, gamma, beta, out, mean, rstd, rows, C, eps);
}
extern "C" __global__ void layernorm_forward_v4(const float* x, const float* gamma, const float* beta,
                                                float* out, float* mean, float* rstd, int rows, int C,
                                                float eps) {
    ln_forward<4, false>(nullptr, nullptr, nullptr, x, gamma, beta, out, mean, rstd, rows, C, eps);
}
extern "C" __global__ void residual_layernorm_forward_v1(const float* a, const float* b, float* residual,
                                                         const float* gamma, const float* beta,
                                                         float* out, float* mean, float* rstd,
                                                         int rows, int C, float eps) {
    ln_forward<1, true>(a, b, residual, nullptr, gamma, beta, out, mean, rstd, rows, C, eps);
}
extern "C" __global__ void residual_layernorm_forward_v4(const float* a, const float* b, float* residual,
                                                         const float* gamma, const float* beta,
                                                         float* out, float* mean, float* rstd,
                                                         int rows, int C, float eps) {
    ln_forward<4, true>(a, b, residual, nullptr, gamma, beta, out, mean, rstd, rows, C, eps);
}

template <int VEC>
__device__ void ln_backward_dx(const float* x, const float* gamma, const float* mean,
                               const float* rstd, const float* dout, float* dx, int rows, int C) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    long long base = (long long)row * C;
    float mu = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    if (VEC == 4) {
        int n4 = C / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x + base);
        const float4* d4 = reinterpret_cast<const float4*>(dout + base);
        const float4* g4 = reinterpret_cast<const float4*>(gamma);
        float4* dx4 = reinterpret_cast<float4*>(dx + base);
        for (int i = lane; i < n4; i += 32) {
            float4 v = x4[i], d = d4[i], g = g4[i];
            float g0 = d.x * g.x, g1 = d.y * g.y, g2 = d.z * g.z, g3 = d.w * g.w;
            sg += (g0 + g1) + (g2 + g3);
            sgx += (g0 * (v.x - mu) + g1 * (v.y - mu)) + (g2 * (v.z - mu) + g3 * (v.w - mu));
        }
        float ag = warp_sum(sg) / C, agx = warp_sum(sgx) * r / C;
        for (int i = lane; i < n4; i += 32) {
            float4 v = x4[i], d = d4[i], g = g4[i], o = dx4[i];
            o.x += r * (d.x * g.x - ag - (v.x - mu) * r * agx);
            o.y += r * (d.y * g.y - ag - (v.y - mu) * r * agx);
            o.z += r * (d.z * g.z - ag - (v.z - mu) * r * agx);
            o.w += r * (d.w * g.w - ag - (v.w - mu) * r * agx);
            dx4[i] = o;
        }
    } else {
        for (int i = lane; i < C; i += 32) {
            float g = dout[base + i] * gamma[i];
            sg += g;
            sgx += g * (x[base + i] - mu);
        }
        float ag = warp_sum(sg) / C, agx = warp_sum(sgx) * r / C;
        for (int i = lane; i < C; i += 32) {
            float xh = (x[base + i] - mu) * r;
            dx[base + i] += r * (dout[base + i] * gamma[i] - ag - xh * agx);
        }
    }
}

extern "C" __global__ void layernorm_backward_dx_v1(const float* x, const float* gamma, const float* mean,
                                                    const float* rstd, const float* dout, float* dx,
                                                    int rows, int C) {
    ln_backward_dx<1>(x, gamma, mean, rstd, dout, dx, rows, C);
}
extern "C" __global__ void layernorm_backward_dx_v4(const float* x, const float* gamma, const float* mean,
                                                    const float* rstd, const float* dout, float* dx,
                                                    int rows, int C) {
    ln_backward_dx<4>(x, gamma, mean, rstd, dout, dx, rows, C);
}

// partial[c·2C + j] = Σ_{rows of chunk c} dout·x̂ (for dγ); partial[c·2C + C + j] = Σ dout (dβ).
extern "C" __global__ void layernorm_param_partials(const float* x, const float* mean, const float* rstd,
                                                    const float* dout, int rows, int C,
                                                    int rows_per_chunk, float* partial) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= C) return;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = min(r0 + rows_per_chunk, (long long)rows);
    float dg = 0.0f, db = 0.0f;
    for (long long r = r0; r < r1; ++r) {
        float d = dout[r * C + j];
        dg += d * ((x[r * C + j] - mean[r]) * rstd[r]);
        db += d;
    }
    long long o = (long long)blockIdx.y * 2 * C + j;
    partial[o] = dg;
    partial[o + C] = db;
}
