// Column sums, deterministically: the bias gradient `dbias[j] += Σ_i dout[i, j]` and the
// last step of the LayerNorm parameter gradients (layernorm.cu writes partials).
//
// Two passes, no atomics, in an order fixed by the sizes only:
//   1. column_partials: grid (ceil(cols / 256), chunks), block 256. Thread (x, c) owns
//      column j = 256·x + tid and sums rows [c·R, min((c+1)·R, rows)) top to bottom into
//      partial[c·cols + j]. A warp reads 32 adjacent columns of one row: 128-byte
//      coalesced loads. R (rows per chunk) comes from plan::reduce and depends only on
//      the shape.
//   2. column_finish: grid ceil(cols / 256), block 256:
//      out[j] += Σ_c partial[c·stride + j], c ascending.
#include "common.cuh"

extern "C" __global__ void column_partials(const float* x, int rows, int cols, int rows_per_chunk,
                                           float* partial) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    long long r0 = (long long)blockIdx.y * rows_per_chunk;
    long long r1 = min(r0 + rows_per_chunk, (long long)rows);
    float s = 0.0f;
    for (long long r = r0; r < r1; ++r) s += x[r * cols + j];
    partial[(long long)blockIdx.y * cols + j] = s;
}

extern "C" __global__ void column_finish(const float* partial, int chunks, int cols,
                                         long long chunk_stride, float* out) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    float s = 0.0f;
    for (int c = 0; c < chunks; ++c) s += partial[(long long)c * chunk_stride + j];
    out[j] += s;
}
