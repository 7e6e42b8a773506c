// Token + position embedding, forward and a deterministic backward (no atomics).
//
//   forward:  out[n, c] = wte[ids[n], c] + wpe[pos_offset + n mod T, c]
//             grid = B·T (one block per token), block 128 (plan::embedding); VEC 4 reads
//             rows as float4 when C ≡ 0 mod 4 and the pointers are 16-byte aligned. An id
//             >= vocab never reaches a kernel (the host checks its copy of the ids), but
//             the kernel still skips it rather than read out of bounds.
//   backward: dwte[v] += dout[n] for every n with ids[n] = v, in increasing n.
//             The host sorts token positions by id (stable) into segments
//             (plan::embedding::segments): `order` lists positions, segment s covers
//             order[seg_start[s] .. seg_start[s+1]) and belongs to id seg_id[s]. One
//             block per segment; thread c adds the rows in order onto the old value, the
//             same sequence of f32 additions as the CPU backend.
//             dwpe[t] += Σ_b dout[b, t], b ascending: grid = T, block 128.
#include "common.cuh"

template <int VEC>
__device__ void emb_fwd(const unsigned* ids, const float* wte, const float* wpe, float* out, int seq,
                        int C, int pos_offset, int vocab) {
    long long n = blockIdx.x;
    unsigned id = ids[n];
    if (id >= (unsigned)vocab) return;
    int t = (int)(n % seq) + pos_offset;
    const float* tok = wte + (long long)id * C;
    const float* pos = wpe + (long long)t * C;
    float* o = out + n * C;
    if (VEC == 4) {
        for (int i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = reinterpret_cast<const float4*>(tok)[i];
            float4 b = reinterpret_cast<const float4*>(pos)[i];
            reinterpret_cast<float4*>(o)[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = tok[i] + pos[i];
    }
}

extern "C" __global__ void embedding_forward_v1(const unsigned* ids, const float* wte, const float* wpe,
                                                float* out, int seq, int C, int pos_offset, int vocab) {
    emb_fwd<1>(ids, wte, wpe, out, seq, C, pos_offset, vocab);
}
extern "C" __global__ void embedding_forward_v4(const unsigned* ids, const float* wte, const float* wpe,
                                                float* out, int seq, int C, int pos_offset, int vocab) {
    emb_fwd<4>(ids, wte, wpe, out, seq, C, pos_offset, vocab);
}

extern "C" __global__ void embedding_backward_wte(const unsigned* order, const unsigned* seg_start,
                                                  const unsigned* seg_id, const float* dout, float* dwte,
                                                  int C, int vocab) {
    int s = blockIdx.x;
    unsigned id = seg_id[s];
    if (id >= (unsigned)vocab) return;
    unsigned p0 = seg_start[s], p1 = seg_start[s + 1];
    float* dst = dwte + (long long)id * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (unsigned p = p0; p < p1; ++p) acc += dout[(long long)order[p] * C + c];
        dst[c] = acc;
    }
}

extern "C" __global__ void embedding_backward_wpe(const float* dout, float* dwpe, int batch, int seq,
                                                  int C) {
    int t = blockIdx.x;
    float* dst = dwpe + (long long)t * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (int b = 0; b < batch; ++b) acc += dout[((long long)b * seq + t) * C + c];
        dst[c] = acc;
    }
}
