#!/bin/sh
for r in 1 2 3; do
  for v in base pa; do
    echo "== $v round $r tiny"
    /tmp/gk-$v --threads 2 --rounds 3 --kernels avx2 --model tiny --only bwd_dwte_lm_head,bwd_dw_qkv,bwd_dw_fc_proj,fwd_lm_head 2>&1 | grep '^{'
    echo "== $v round $r 120m"
    /tmp/gk-$v --threads 2 --rounds 3 --kernels avx2 --only bwd_dwte_lm_head,bwd_dw_qkv,bwd_dw_fc_proj 2>&1 | grep '^{'
  done
done
