#!/bin/bash
# Decode, before (/tmp/andrea-base: f4cf7c4) and after (/tmp/andrea-wip: AVX2 four-row dots for
# the tied output layer and the decode attention's scores), alternated three times.
for r in 1 2 3; do for v in base wip; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench decode --config configs/tiny.toml --batch-size 1 --seq-len 256 --steps 500 --warmup 20 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^attention|^step"
done; done
for r in 1 2; do for v in base wip; do
  echo "== 120m $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 64 --warmup 8 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^attention|^step"
done; done
