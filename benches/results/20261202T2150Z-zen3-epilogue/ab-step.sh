#!/bin/bash
# The ANDREA-120M training step, old (7091c4e) and new binaries alternated, with --profile.
for r in 1 2 3; do for v in old new; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 4 --warmup 1 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^step"
done; done
