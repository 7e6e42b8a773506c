#!/usr/bin/env bash
# Data parallelism on one machine: alternating runs of 1 process x 2 threads
# (--grad-accum 2) and `mpirun -np 2` x 1 thread (--grad-accum 1), the same global batch;
# prints each run's median tokens/s over its steps after the first, the median of the
# runs, and the 2-rank runs' all-reduce line. Results: benches/README.md, "Data parallel".
#
# usage: benches/mpi/compare.sh <config> <batch> <steps> <pairs> <tag>
#   ANDREA (default target/release/andrea, built with --features mpi), WORK (default
#   target/mpi-bench: a generated corpus, a tokenizer of 8192 merges, shards, the runs).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
A="${ANDREA:-$root/target/release/andrea}"
work="${WORK:-$root/target/mpi-bench}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cfg=$(realpath "$1") b=$2 steps=$3 pairs=$4 tag=$5
mkdir -p "$work/runs" && cd "$work"
if [ ! -d data ]; then
  # 3.9 MB of random words: enough for 8192 merges, so the vocabulary is ANDREA-120M's 8449.
  python3 - <<'PY'
import os, random
random.seed(1)
words = ["".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(random.randint(2, 9)))
         for _ in range(30000)]
os.makedirs("corpus", exist_ok=True)
for f in range(4):
    with open(f"corpus/doc{f}.txt", "w") as out:
        out.write(" ".join(random.choice(words) for _ in range(150000)))
PY
  "$A" tokenizer train corpus --merges 8192 --out tokenizer.json
  "$A" prepare corpus --tokenizer tokenizer.json --out data
fi
common=(train --config "$cfg" --data data --batch-size "$b" --seq-len 256 --steps "$steps"
  --warmup-steps 1 --eval-every 0 --eval-batches 1 --sample-every 0 --checkpoint-every 0
  --overwrite)
for i in $(seq 1 "$pairs"); do
  "$A" --threads 2 "${common[@]}" --grad-accum 2 --out "runs/$tag-one-$i" 2> "runs/$tag-one-$i.log"
  mpirun --oversubscribe -np 2 "$A" --threads 1 "${common[@]}" --out "runs/$tag-two-$i" \
    2> "runs/$tag-two-$i.log"
done
python3 - "$tag" "$pairs" <<'PY'
import json, statistics, sys
tag, pairs = sys.argv[1], int(sys.argv[2])
for kind in ("one", "two"):
    meds = []
    for i in range(1, pairs + 1):
        rows = [json.loads(l) for l in open(f"runs/{tag}-{kind}-{i}/metrics.jsonl")]
        meds.append(statistics.median(r["tokens_per_s"] for r in rows[1:]))
    print(tag, kind, "per-run medians", [round(m, 1) for m in meds],
          "median", round(statistics.median(meds), 1))
PY
grep -h "all-reduce:" "runs/$tag"-two-*.log
