#!/bin/bash
# Same binary, attention products default (sgemm, gemm crate) vs ANDREA_ATTENTION_PRODUCTS=avx512, alternating.
for i in 1 2 3 4; do for v in sgemm avx512; do
  echo "== $v run $i; loadavg $(cat /proc/loadavg)"
  echo "\$ ANDREA_ATTENTION_PRODUCTS=$v /tmp/t2/andrea-new --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile"
  ANDREA_ATTENTION_PRODUCTS=$v /tmp/t2/andrea-new --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1
done; done
