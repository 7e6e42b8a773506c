#!/bin/bash
# usage: ab.sh newbin runs -> old (main, /tmp/t2/andrea-old) vs new, alternating, tiny step with --profile
new=$1; n=${2:-4}
for i in $(seq 1 $n); do for bin in /tmp/t2/andrea-old $new; do
  echo "== $bin run $i; loadavg $(cat /proc/loadavg)"
  echo "\$ $bin --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile"
  $bin --threads 2 bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 --profile 2>&1
done; done
