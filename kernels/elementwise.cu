// Residual add, scale, strided copy and the BF16 conversions.
//
// Launch (all three): 1-D grid-stride; block 256; grid min(ceil(n / (256·VEC)), 8192)
// as chosen by plan::elementwise. VEC = 4 uses 16-byte float4 loads and stores; the host
// picks it only when every pointer is 16-byte aligned (view offsets ≡ 0 mod 4). The
// n mod 4 tail is then done by the first threads of the grid with scalar accesses.
//
//   add:   out[i] = a[i] + b[i]     (out may be exactly a or b: same index, same thread)
//   scale: x[i] *= alpha
//   copy:  dst[b,i,j] = src[b,i,j] for any strides (KV-cache appends, row gathers);
//          the flat index runs j fastest so contiguous rows are coalesced.
//   f32_to_bf16: dst[i] = bf16(src[i])  (cvt.rn: nearest, ties to even)
//   bf16_to_f32: dst[i] = float(src[i]) (exact)
//          one element a thread (VEC = 1): 6 bytes an element, bound by memory
//          (H200 at ~4.3 TB/s: 6 MB, ~1.4 µs, per million elements; an estimate).
#include "common.cuh"

template <int VEC>
__device__ void add_impl(const float* a, const float* b, float* out, long long n) {
    if (VEC == 4) {
        long long n4 = n / 4;
        const float4* a4 = reinterpret_cast<const float4*>(a);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        float4* o4 = reinterpret_cast<float4*>(out);
        GRID_STRIDE(i, n4) {
            float4 x = a4[i], y = b4[i];
            o4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
        long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n) out[t] = a[t] + b[t];
    } else {
        GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
    }
}

template <int VEC>
__device__ void scale_impl(float* x, float alpha, long long n) {
    if (VEC == 4) {
        long long n4 = n / 4;
        float4* x4 = reinterpret_cast<float4*>(x);
        GRID_STRIDE(i, n4) {
            float4 v = x4[i];
            x4[i] = make_float4(v.x * alpha, v.y * alpha, v.z * alpha, v.w * alpha);
        }
        long long t = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (t < n) x[t] *= alpha;
    } else {
        GRID_STRIDE(i, n) { x[i] *= alpha; }
    }
}

extern "C" __global__ void add_v1(const float* a, const float* b, float* out, long long n) {
    add_impl<1>(a, b, out, n);
}
extern "C" __global__ void add_v4(const float* a, const float* b, float* out, long long n) {
    add_impl<4>(a, b, out, n);
}
extern "C" __global__ void scale_v1(float* x, float alpha, long long n) { scale_impl<1>(x, alpha, n); }
extern "C" __global__ void scale_v4(float* x, float alpha, long long n) { scale_impl<4>(x, alpha, n); }

extern "C" __global__ void copy_strided(const float* src, float* dst, int batch, int rows, int cols,
                                        long long s_bs, long long s_rs, long long s_cs,
                                        long long d_bs, long long d_rs, long long d_cs) {
    long long n = (long long)batch * rows * cols;
    GRID_STRIDE(e, n) {
        long long j = e % cols;
        long long r = e / cols;
        long long i = r % rows;
        long long b = r / rows;
        dst[b * d_bs + i * d_rs + j * d_cs] = src[b * s_bs + i * s_rs + j * s_cs];
    }
}

extern "C" __global__ void f32_to_bf16(const float* src, unsigned short* dst, long long n) {
    GRID_STRIDE(i, n) { dst[i] = bf16_bits(src[i]); }
}

extern "C" __global__ void bf16_to_f32(const unsigned short* src, float* dst, long long n) {
    GRID_STRIDE(i, n) { dst[i] = bf16_to_float(src[i]); }
}
