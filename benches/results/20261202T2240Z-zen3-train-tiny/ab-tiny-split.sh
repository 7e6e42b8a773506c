#!/bin/bash
# The tiny training step: resize (f... the packing buffers grown, never shrunk) and split
# (+ the AVX2 kernel's column blocks only when 2m <= n), alternated five times.
for r in 1 2 3 4 5; do for v in resize split; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^attention|^step"
done; done
