#!/bin/bash
out=$1; shift
for round in 1 2; do
for v in "$@"; do
  ANDREA_SIMD=avx2 TMP_AVX2_BLOCKING=$v target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels avx2,gemm --only fwd_qkv,fwd_fc,fwd_lm_head,bwd_dx_fc_proj,bwd_dw_qkv,bwd_dw_fc_proj,fused_linear_gelu | sed "s/^/{\"v\":\"$v\",\"r\":$round,\"x\":/; s/\$/}/" >> $out
done; done
