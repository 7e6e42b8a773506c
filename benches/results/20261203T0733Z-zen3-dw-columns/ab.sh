#!/bin/bash
# A/B of the AVX2 kernel's split for a transposed A with m < n: row blocks (old: /tmp/gk-old,
# /tmp/andrea-main = main at 8142b0a) vs column blocks (new: /tmp/gk-new, /tmp/andrea-new),
# alternated. The gemm_kernels binaries are the same source but for the rule.
cd "$(git rev-parse --show-toplevel)"
S=bwd_dw_qkv,bwd_dw_fc,bwd_dw_attn_proj,bwd_dw_fc_proj
for r in 1 2 3; do
  for v in old new; do
    echo "# round $r $v load $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/gk-$v --threads 2 --rounds 5 --kernels avx2 --model tiny --only $S
    /tmp/gk-$v --threads 2 --rounds 3 --kernels avx2 --only $S
  done
done
for r in 1 2 3; do
  for v in main new; do
    echo "# step round $r $v load $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/andrea-$v bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1 | grep -E "tokens/s|^matmul_add|^matmul "
    /tmp/andrea-$v bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 4 --warmup 1 --profile 2>&1 | grep -E "tokens/s|^matmul_add|^matmul "
  done
done
