// Self-tests of the tensor-core and asynchronous-copy wrappers of common.cuh, each
// against a plain per-element computation on the host
// (crates/andrea-cuda/tests/tensor_core_wrappers.rs). One warp (block 32) each; every
// kernel takes a `fault` argument that plants one bug the test must catch (0: none):
//
//   tc_selftest_mma_bf16(A [16, 16], B [16, 8], C [16, 8], D [16, 8], fault)
//       builds the fragments from FP32 with pack_bf16x2, D = A·B + C; fault 1: lanes 0
//       and 1 load each other's fragments.
//   tc_selftest_mma_tf32(A [16, 8], B [8, 8], C [16, 8], D [16, 8], convert, fault)
//       fragments by f32_to_tf32 (convert = 1) or the raw FP32 bits (0); fault 1: lanes 5
//       and 6 swap their A fragments.
//   tc_selftest_ldmatrix(src [4·64] b16 values as floats, out [32, 4] u32 bits, count,
//       trans, fault): src holds matrices 0..3 (8 x 8, row-major) copied to shared memory
//       with a padded row pitch; lane l passes row l % 8 of matrix l / 8. fault 1: lane
//       3 passes row 4; fault 2: lane 0's address is off by 8 bytes (misaligned: a
//       launch error); fault 3: lane 0 passes a global-memory address (a launch error).
//   tc_selftest_cp_async(src [160], out [3, 160], n, fault): thread i copies floats
//       4i..4i+3 of src (group 0, cp_async_16) and 128 + i (group 1, cp_async_4) into
//       shared memory buf[160] filled with -1, src_bytes zero-filling past n. out[0..160):
//       buf right after both commits, before any wait (must still be all -1);
//       out[160..320): after cp_async_wait<1> (group 0 landed, group 1 not);
//       out[320..480): after cp_async_wait<0>. fault 1: the first wait missing; 2: the
//       mask off by one float. Launch errors the emulator must raise: 3: a copy never
//       committed; 4: a wait with no commit before it; 5: a thread exits with a
//       committed copy in flight; 6: a wait while a copy is issued but not committed.
//   tc_selftest_cvt: the two conversions on exact ties and NaN (below).
#include "common.cuh"

// Row-major element (r, c) of a matrix with `cols` columns.
#define AT(p, cols, r, c) ((p)[(r) * (cols) + (c)])

extern "C" __global__ void tc_selftest_mma_bf16(const float* A, const float* B, const float* C, float* D,
                                                int fault) {
    int lane = threadIdx.x;
    int src = lane;
    if (fault == 1 && lane < 2) src = 1 - lane;
    int g = src / 4, t = src % 4;
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) {
        int r = g + 8 * (i & 1), c = 2 * t + 8 * (i >> 1);
        a[i] = pack_bf16x2(AT(A, 16, r, c), AT(A, 16, r, c + 1));
    }
    for (int i = 0; i < 2; ++i) {
        int k = 2 * t + 8 * i;
        b[i] = pack_bf16x2(AT(B, 8, k, g), AT(B, 8, k + 1, g));
    }
    g = lane / 4;
    t = lane % 4;
    float c[4], d[4];
    for (int j = 0; j < 4; ++j) c[j] = AT(C, 8, g + 8 * (j >> 1), 2 * t + (j & 1));
    mma_bf16_m16n8k16(d, a, b, c);
    for (int j = 0; j < 4; ++j) AT(D, 8, g + 8 * (j >> 1), 2 * t + (j & 1)) = d[j];
}

__device__ __forceinline__ unsigned tf32_operand(float x, int convert) {
    if (convert) return f32_to_tf32(x);
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}

extern "C" __global__ void tc_selftest_mma_tf32(const float* A, const float* B, const float* C, float* D,
                                                int convert, int fault) {
    int lane = threadIdx.x;
    int asrc = lane;
    if (fault == 1 && (lane == 5 || lane == 6)) asrc = 11 - lane;
    int g = asrc / 4, t = asrc % 4;
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = tf32_operand(AT(A, 8, g + 8 * (i & 1), t + 4 * (i >> 1)), convert);
    g = lane / 4;
    t = lane % 4;
    for (int i = 0; i < 2; ++i) b[i] = tf32_operand(AT(B, 8, t + 4 * i, g), convert);
    float c[4], d[4];
    for (int j = 0; j < 4; ++j) c[j] = AT(C, 8, g + 8 * (j >> 1), 2 * t + (j & 1));
    mma_tf32_m16n8k8(d, a, b, c);
    for (int j = 0; j < 4; ++j) AT(D, 8, g + 8 * (j >> 1), 2 * t + (j & 1)) = d[j];
}

// Four 8 x 8 b16 matrices, row pitch 24 elements (48 bytes: rows stay 16-byte aligned).
#define LDM_PITCH 24

extern "C" __global__ void tc_selftest_ldmatrix(const float* src, float* out, int count, int trans,
                                                int fault) {
    __shared__ __align__(16) unsigned short tile[4 * 8 * LDM_PITCH];
    int lane = threadIdx.x;
    for (int e = lane; e < 4 * 64; e += 32) {
        int m = e / 64, r = (e / 8) % 8, c = e % 8;
        tile[(m * 8 + r) * LDM_PITCH + c] = (unsigned short)src[e];
    }
    __syncwarp();
    int m = lane / 8, r = lane % 8;
    if (fault == 1 && lane == 3) r = 4;
    const char* p = reinterpret_cast<const char*>(&tile[(m * 8 + r) * LDM_PITCH]);
    if (fault == 2 && lane == 0) p += 8;
    if (fault == 3 && lane == 0) p = reinterpret_cast<const char*>(src);
    unsigned v[4] = {0, 0, 0, 0};
    if (count == 4) {
        unsigned x[4];
        if (trans) ldmatrix_x4_trans(x, p);
        else ldmatrix_x4(x, p);
        for (int i = 0; i < 4; ++i) v[i] = x[i];
    } else {
        unsigned x[2];
        if (trans) ldmatrix_x2_trans(x, p);
        else ldmatrix_x2(x, p);
        v[0] = x[0];
        v[1] = x[1];
    }
    unsigned* o = reinterpret_cast<unsigned*>(out);
    for (int i = 0; i < 4; ++i) o[lane * 4 + i] = v[i];
}

extern "C" __global__ void tc_selftest_cp_async(const float* src, float* out, int n, int fault) {
    __shared__ __align__(16) float buf[160];
    int i = threadIdx.x;
    if (fault == 4) cp_async_wait<0>();
    for (int e = i; e < 160; e += 32) buf[e] = -1.0f;
    __syncthreads();
    int mask_n = fault == 2 ? n + 1 : n;
    // Group 0: floats 4i..4i+3, zero past n.
    int valid = min(max(mask_n - 4 * i, 0), 4);
    cp_async_16(&buf[4 * i], src + 4 * i, 4 * valid);
    cp_async_commit();
    // Group 1: float 128 + i, by the 4-byte form.
    cp_async_4(&buf[128 + i], src + 128 + i, 128 + i < mask_n ? 4 : 0);
    if (fault != 6) cp_async_commit();
    __syncthreads();
    for (int e = i; e < 160; e += 32) out[e] = buf[e];
    __syncthreads();
    if (fault != 1) cp_async_wait<1>();
    __syncthreads();
    for (int e = i; e < 160; e += 32) out[160 + e] = buf[e];
    __syncthreads();
    cp_async_wait<0>();
    __syncthreads();
    for (int e = i; e < 160; e += 32) out[320 + e] = buf[e];
    if (fault == 3 || fault == 5) cp_async_4(&buf[i], src, 4);
    if (fault == 5) cp_async_commit();
}

// tc_selftest_cvt(x [n], out [2n] u32 bits, n, fault): out[2i] = f32_to_tf32(x[i]),
// out[2i + 1] = pack_bf16x2(x[i], -x[i]); fault 1: both truncate instead of rounding.
extern "C" __global__ void tc_selftest_cvt(const float* x, float* out, int n, int fault) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned* o = reinterpret_cast<unsigned*>(out);
    float v = x[i];
    if (fault == 1) {
        unsigned u, w;
        float m = -v;
        memcpy(&u, &v, 4);
        memcpy(&w, &m, 4);
        o[2 * i] = u & ~0x1fffu;
        o[2 * i + 1] = (u >> 16) | (w & 0xffff0000u);
        return;
    }
    o[2 * i] = f32_to_tf32(v);
    o[2 * i + 1] = pack_bf16x2(v, -v);
}
