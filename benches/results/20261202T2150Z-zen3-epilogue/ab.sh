#!/bin/bash
# old/new alternated
for r in 1 2; do for v in old new; do
/tmp/gk-$v --threads 2 --rounds 5 --kernels avx2 --only "$ONLY" | python3 -c "
import sys,json
for l in sys.stdin:
  d=json.loads(l); print(f\"$v {d['shape']:45s} {d['gflops']:7.1f} {d['best_gflops']:7.1f}\")"
done; done
