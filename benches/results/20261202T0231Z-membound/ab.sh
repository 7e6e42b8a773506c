#!/bin/bash
# usage: ab.sh OUTDIR FILTER ROUNDS BIN_A BIN_B  (env passed through, e.g. ANDREA_SIMD)
out=$1; filter=$2; rounds=$3; a=$4; b=$5
mkdir -p $out
for r in $(seq 1 $rounds); do
  for side in A B; do
    bin=$a; [ $side = B ] && bin=$b
    f=$out/$side-$r.txt
    { echo "# $(date -u +%H:%M:%S) side $side round $r bin $bin ANDREA_SIMD=${ANDREA_SIMD:-} loadavg $(cat /proc/loadavg)"; } > $f
    $bin --bench "$filter" >> $f 2>&1
    echo "# end $(date -u +%H:%M:%S) loadavg $(cat /proc/loadavg)" >> $f
  done
done
