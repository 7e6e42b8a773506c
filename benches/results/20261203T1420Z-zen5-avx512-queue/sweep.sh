#!/bin/bash
# usage: sweep.sh OUT variants...
out=$1; shift
for round in 1 2; do
for v in "$@"; do
  ANDREA_GEMM_QUEUE_BLOCKING=$v target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels avx512-queue,gemm --only fwd_qkv,fwd_fc,fwd_lm_head,bwd_dx_fc_proj,bwd_dw_qkv,bwd_dw_fc_proj,fused_linear_gelu | sed "s/^/{\"v\":\"$v\",\"r\":$round,\"x\":/; s/\$/}/" >> $out
done; done
