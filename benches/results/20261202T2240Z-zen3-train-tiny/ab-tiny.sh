#!/bin/bash
# The tiny training step: head (e6c8801), resize (+ the packing buffers grown, never shrunk),
# split (+ column blocks only when 2m <= n), alternated four times.
for r in 1 2 3 4; do for v in head resize split; do
  echo "== $v run $r, load $(cut -d' ' -f1 /proc/loadavg)"
  /tmp/andrea-$v bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1 | grep -E "tokens/s|^matmul|^linear_gelu|^attention|^step"
done; done
