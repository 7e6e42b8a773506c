#!/bin/bash
# One andrea-vs-PyTorch session of benches/README.md "Model": for each of the four
# measurements, andrea, PyTorch, andrea, PyTorch, andrea; one line per run: the 1-minute
# load average before it, then the run's JSON object.
#
#   cargo build --release -p andrea-model --example bench
#   PYTHON=/path/to/venv/bin/python benches/pytorch/session.sh > session.txt
#
# PYTHON needs torch and transformers (default: python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
A=target/release/examples/bench
P="${PYTHON:-python3} benches/pytorch/train_step.py"
specs=("configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 5"
       "configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3"
       "configs/andrea-120m.toml --decode --batch-size 1 --seq-len 256 --steps 64"
       "configs/tiny.toml --decode --batch-size 1 --seq-len 256 --steps 500 --warmup 20")
for spec in "${specs[@]}"; do
  for who in andrea pytorch andrea pytorch andrea; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086
    if [ "$who" = andrea ]; then out=$($A --config $spec); else out=$($P --config $spec 2>/dev/null); fi
    echo "$load $out"
  done
done
