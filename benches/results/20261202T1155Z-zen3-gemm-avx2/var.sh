#!/bin/bash
# usage: var.sh "<gemm_kernels args>" "ENV1" "ENV2" ...
args="$1"; shift
for r in 1 2; do
for v in "$@"; do
  env $v target/release/examples/gemm_kernels $args --kernels avx2 2>/dev/null | python3 -c "
import sys,json
for l in sys.stdin:
  try: d=json.loads(l)
  except: continue
  print('$v'.ljust(22), d['shape'].ljust(40), d['gflops'], d['best_gflops'])"
done; done
