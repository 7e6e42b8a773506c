#!/bin/bash
# tiny training step: before, after (small products), after with sgemm products; alternating
out=$1; rounds=$2; mkdir -p $out
cd /work/wt-membound
for r in $(seq 1 $rounds); do
  for side in before after after-sgemm; do
    bin=/tmp/mb/andrea-after; [ $side = before ] && bin=/tmp/mb/andrea-before
    env=""; [ $side = after-sgemm ] && env="ANDREA_ATTENTION_PRODUCTS=sgemm"
    l=$(cat /proc/loadavg)
    j=$(env $env $bin bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 5 --json 2>&1 | tail -1)
    echo "{\"side\":\"$side\",\"round\":$r,\"ANDREA_SIMD\":\"${ANDREA_SIMD:-}\",\"loadavg\":\"$l\",\"result\":$j}" >> $out/runs.jsonl
  done
done
