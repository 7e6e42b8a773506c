#!/bin/bash
# usage: run.sh label blocking
cd /work/main
ANDREA_GEMM_AVX512_BLOCKING="$2" ./target/release/examples/gemm_kernels --threads 2 --rounds 25 --kernels avx512-blocks,gemm --only fwd_fc,bwd_dx_fc_proj,bwd_dw_fc,fwd_qkv,bwd_dw_qkv,fwd_fc_proj > /tmp/sweep/$1.jsonl 2>&1
python3 - "$1" <<'PY'
import json,sys,statistics
rows=[json.loads(l) for l in open(f"/tmp/sweep/{sys.argv[1]}.jsonl") if l.startswith("{")]
by={}
for r in rows: by.setdefault(r["shape"],{})[r["kernel"]]=r["gflops"]
rat=[v["avx512-blocks"]/v["gemm"] for v in by.values() if "avx512-blocks" in v and "gemm" in v]
print(sys.argv[1], "median ratio avx512/gemm %.3f"%statistics.median(rat), " ".join("%.2f"%x for x in rat), "gemm med %.0f"%statistics.median(v["gemm"] for v in by.values()), "avx512 med %.0f"%statistics.median(v["avx512-blocks"] for v in by.values()))
PY
