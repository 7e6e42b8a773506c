// GELU forward and backward, tanh form (the model's `gelu_new`):
//
//   gelu(x)  = 0.5·x·(1 + tanh(u)),  u = sqrt(2/π)·(x + 0.044715·x³)
//   gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 - t²)·sqrt(2/π)·(1 + 3·0.044715·x²),  t = tanh(u)
//
// `_approx` variants take tanh from the hardware instruction `tanh.approx.f32` (inline
// PTX in common.cuh: one SFU op, relative error ~2^-11); `_exact` variants use tanhf.
// The backend picks `_approx` in its fast precision mode (the default for training)
// and `_exact` in FP32 mode (what the conformance suite runs).
//
// Launch: 1-D grid-stride, block 256, VEC 4 = float4 accesses when all pointers are
// 16-byte aligned (plan::elementwise), scalar tail as in elementwise.cu.
// In place is allowed (out == x, dx == dout): each element is read then written by one
// thread.
#include "common.cuh"

template <bool APPROX, int VEC>
__device__ void gelu_fwd(const float* x, float* out, long long n) {
    if (VEC == 4) {
        long long n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        float4* o4 = reinterpret_cast<float4*>(out);
        GRID_STRIDE(i, n4) {
            float4 v = x4[i];
            o4[i] = make_float4(gelu_f<APPROX>(v.x), gelu_f<APPROX>(v.y), gelu_f<APPROX>(v.z),
                                gelu_f<APPROX>(v.w));
        }
        long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n) out[t] = gelu_f<APPROX>(x[t]);
    } else {
        GRID_STRIDE(i, n) { out[i] = gelu_f<APPROX>(x[i]); }
    }
}

template <bool APPROX, int VEC>
__device__ void gelu_bwd(const float* x, const float* dout, float* dx, long long n) {
    if (VEC == 4) {
        long long n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const float4* g4 = reinterpret_cast<const float4*>(dout);
        float4* d4 = reinterpret_cast<float4*>(dx);
        GRID_STRIDE(i, n4) {
            float4 v = x4[i], g = g4[i];
            d4[i] = make_float4(g.x * gelu_grad_f<APPROX>(v.x), g.y * gelu_grad_f<APPROX>(v.y),
                                g.z * gelu_grad_f<APPROX>(v.z), g.w * gelu_grad_f<APPROX>(v.w));
        }
        long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n) dx[t] = dout[t] * gelu_grad_f<APPROX>(x[t]);
    } else {
        GRID_STRIDE(i, n) { dx[i] = dout[i] * gelu_grad_f<APPROX>(x[i]); }
    }
}

#define GELU_ENTRIES(NAME, APPROX)                                                              \
    extern "C" __global__ void gelu_forward_##NAME##_v1(const float* x, float* out, long long n) { \
        gelu_fwd<APPROX, 1>(x, out, n);                                                          \
    }                                                                                            \
    extern "C" __global__ void gelu_forward_##NAME##_v4(const float* x, float* out, long long n) { \
        gelu_fwd<APPROX, 4>(x, out, n);                                                          \
    }                                                                                            \
    extern "C" __global__ void gelu_backward_##NAME##_v1(const float* x, const float* dout,     \
                                                         float* dx, long long n) {               \
        gelu_bwd<APPROX, 1>(x, dout, dx, n);                                                     \
    }                                                                                            \
    extern "C" __global__ void gelu_backward_##NAME##_v4(const float* x, const float* dout,     \
                                                         float* dx, long long n) {               \
        gelu_bwd<APPROX, 4>(x, dout, dx, n);                                                     \
    }

GELU_ENTRIES(exact, false)
GELU_ENTRIES(approx, true)
