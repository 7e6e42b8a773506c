#!/bin/sh
for r in 1 2 3; do
  for v in base pf; do
    echo "== $v round $r"
    /tmp/gk-$v --threads 2 --rounds 3 --kernels avx2 2>&1 | grep '^{'
  done
done
