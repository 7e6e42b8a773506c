// The squared global gradient norm Σ x², accumulated in f64, deterministically.
//
//   1. sum_squares_partials: grid = chunks (<= 1024, plan::reduce::sum_squares), block
//      256. Block c sums x[c·chunk, min((c+1)·chunk, n)): thread t takes elements
//      t, t+256, ... of the chunk (squares and sums in f64), then a fixed shuffle tree and
//      a fixed 8-warp tree give partial[c]. With VEC 4 the chunk is read as float4 (host
//      guarantees 16-byte alignment and chunk ≡ 0 mod 4).
//   2. sum_squares_finish: one block of 256: thread t sums partial[t], partial[t+256], ...
//      then the same trees; out[0] = total.
//   3. clip_scale (andrea_core::OptimOps::clip_scale): one block of 256 reads the total
//      and checks the guard (the step's losses) for non-finite values, then thread 0
//      writes out = [(mean·clip) as f32, norm as f32, clip as f32] with the host's f64
//      formula (andrea_core::clip_stats; IEEE sqrt and division, so bit for bit the
//      same), out[0] = NaN when the norm or a guard value is not finite.
//      Expected H200 time: ~3 µs, a launch (the guard is 64 KB at 16 x 1024).
// The chunking depends only on n, so the result is the same on every run and device.
#include "common.cuh"

__device__ double block_sum_d(double v) {
    __shared__ double warps[32];
    v = warp_sum_d(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) warps[w] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = (threadIdx.x < nw) ? warps[threadIdx.x] : 0.0;
    if (w == 0) v = warp_sum_d(v);
    return v;
}

template <int VEC>
__device__ void partials_impl(const float* x, long long n, long long chunk, double* partial) {
    long long c0 = (long long)blockIdx.x * chunk;
    long long c1 = min(c0 + chunk, n);
    double s = 0.0;
    if (VEC == 4) {
        long long v0 = c0 / 4, v1 = c1 / 4;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        for (long long i = v0 + threadIdx.x; i < v1; i += blockDim.x) {
            float4 v = x4[i];
            s += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
        for (long long i = v1 * 4 + threadIdx.x; i < c1; i += blockDim.x) s += (double)x[i] * x[i];
    } else {
        for (long long i = c0 + threadIdx.x; i < c1; i += blockDim.x) s += (double)x[i] * x[i];
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void sum_squares_partials_v1(const float* x, long long n, long long chunk,
                                                   double* partial) {
    partials_impl<1>(x, n, chunk, partial);
}
extern "C" __global__ void sum_squares_partials_v4(const float* x, long long n, long long chunk,
                                                   double* partial) {
    partials_impl<4>(x, n, chunk, partial);
}

extern "C" __global__ void sum_squares_finish(const double* partial, int count, double* out) {
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0) out[0] = s;
}

// max_norm <= 0: no clipping (the host checks a given one is > 0).
extern "C" __global__ void clip_scale(const double* total, double mean, float max_norm,
                                      const float* guard, long long guard_n, float* out) {
    // x - x is 0 exactly when x is finite (NaN and ±inf give NaN).
    __shared__ int bad;
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    int mine = 0;
    for (long long i = threadIdx.x; i < guard_n; i += blockDim.x) mine |= !(guard[i] - guard[i] == 0.0f);
    if (mine) bad = 1;  // every writer stores the same value
    __syncthreads();
    if (threadIdx.x != 0) return;
    double norm = sqrt(total[0]) * mean;
    double clip = 1.0;
    if (max_norm > 0.0f && (double)max_norm / (norm + 1e-6) < 1.0) clip = (double)max_norm / (norm + 1e-6);
    float scale = (float)(mean * clip);
    if (!(norm - norm == 0.0) || bad) scale = __builtin_nanf("");
    out[0] = scale;
    out[1] = (float)norm;
    out[2] = (float)clip;
}
