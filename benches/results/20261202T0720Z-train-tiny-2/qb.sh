#!/bin/bash
# main (QUERY_BLOCK 64) vs QUERY_BLOCK 32 vs 128, rotating, tiny step with --profile
for i in 1 2 3 4; do for bin in /tmp/t2/andrea-main /tmp/t2/andrea-qb32 /tmp/t2/andrea-qb128; do
  echo "== $bin run $i; loadavg $(cat /proc/loadavg)"
  echo "\$ $bin --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile"
  $bin --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1
done; done
