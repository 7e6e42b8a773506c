#!/bin/bash
# Each ANDREA-120M step product on andrea's AVX2 kernel, caches warm (--cold off) and
# evicted before each call (--cold on), alternated, 3 rounds; the FMA probe at the end.
cd "$(git rev-parse --show-toplevel)"
for r in 1 2 3; do
  for c in off on; do
    echo "# round $r cold $c load $(cut -d' ' -f1-3 /proc/loadavg)"
    target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels avx2 --cold $c
  done
done
target/release/examples/peaks --threads 2 --read-mb 366
