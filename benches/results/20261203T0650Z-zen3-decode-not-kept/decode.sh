#!/bin/bash
# A/B of the row form's rows per pass: 4 (main) vs 8, decode ANDREA-120M and tiny at batch 1, alternated.
cd /work/main
for r in 1 2 3; do
  for v in 4rows 8rows; do
    echo "== $v round $r $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/andrea-$v bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 64 2>&1 | grep tokens/s
    /tmp/andrea-$v bench decode --config configs/tiny.toml --batch-size 1 --seq-len 256 --steps 256 2>&1 | grep tokens/s
  done
  target/release/examples/peaks --threads 2 --read-mb 366 --reps 3
done
