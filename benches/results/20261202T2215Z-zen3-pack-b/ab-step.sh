#!/bin/bash
# The ANDREA-120M training step, before (/tmp/andrea-new: 38260c4, the epilogues) and after
# (/tmp/andrea-packb: transposed B packed through 8 x 8 register transposes), alternated.
for r in 1 2 3; do for v in new packb; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 4 --warmup 1 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^step"
done; done
