#!/bin/bash
# A/B of the memory-bound ops: old and new ops bench binaries alternated, each op with its own-size copy.
cd /work/main
F=${F:-'memory_bound/[a-z0-9-]+/(layernorm|layernorm_backward|embedding_backward|softmax_causal)_[0-9x]+$'}
for r in 1 2 3; do for b in old new; do
  /tmp/ops-$b --bench "$F" --warm-up-time 1 --measurement-time 3 --noplot 2>&1 | awk -v b=$b -v r=$r '/^memory_bound/{name=$1} /thrpt:/ && name!="" {print r, b, name, $4, $5; name=""}'
done; done
