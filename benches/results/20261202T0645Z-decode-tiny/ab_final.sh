#!/bin/bash
# A/B alternating: A = main's binary (copy), B = this branch's. Raw JSON lines.
A=/tmp/andrea-base; B=/tmp/andrea-new2
TINY="bench decode --config configs/tiny.toml --batch-size 1 --seq-len 256 --steps 500 --warmup 20 --json"
BIG="bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 40 --warmup 4 --json"
cd /work/wt-decode
echo "# A = $A (main 321a5c9), B = $B (decode-tiny 7ebcfdc)"
echo "# tiny: andrea --threads 2 $TINY"
for i in 1 2 3 4 5; do
  for which in A B; do
    bin=${!which}
    echo "loadavg $(cat /proc/loadavg)"
    echo "$which $($bin --threads 2 $TINY)"
  done
done
echo "# 120M: andrea --threads 2 $BIG"
for i in 1 2 3; do
  for which in A B; do
    bin=${!which}
    echo "loadavg $(cat /proc/loadavg)"
    echo "$which $($bin --threads 2 $BIG)"
  done
done
