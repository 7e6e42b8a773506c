#!/bin/bash
# The tiny step only, main vs new, 8 alternated rounds, with the per-op profile.
cd "$(git rev-parse --show-toplevel)"
for r in 1 2 3 4 5 6 7 8; do
  for v in main new; do
    echo "# step round $r $v load $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/andrea-$v bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1 | grep -E "tokens/s|^matmul_add|^matmul "
  done
done
