#!/bin/bash
# The tiny training step, old (7091c4e) and new binaries alternated, with --profile.
for r in 1 2 3; do for v in old new; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^attention|^step"
done; done
