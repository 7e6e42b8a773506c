#!/bin/bash
# A/B alternating: A = $A, B = $B (binary copies). Raw JSON lines with the load average before each.
A=${A:-/tmp/wt-decode2-base}; B=${B:-/tmp/wt-decode2-new}; N=${N:-5}; NB=${NB:-3}
TINY="bench decode --config configs/tiny.toml --batch-size 1 --seq-len 256 --steps 500 --warmup 20 --json"
BIG="bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 40 --warmup 4 --json"
cd /work/wt-decode2
echo "# A = $A, B = $B"
echo "# tiny: andrea --threads 2 $TINY"
for i in $(seq $N); do
  for which in A B; do
    bin=${!which}
    echo "loadavg $(cat /proc/loadavg)"
    echo "$which $($bin --threads 2 $TINY)"
  done
done
echo "# 120M: andrea --threads 2 $BIG"
for i in $(seq $NB); do
  for which in A B; do
    bin=${!which}
    echo "loadavg $(cat /proc/loadavg)"
    echo "$which $($bin --threads 2 $BIG)"
  done
done
