#!/usr/bin/env bash
# Final quiet-window measurements (issue 17), run from /work/main with nothing else running.
set -u
cd /work/main
export PYTHON=/work/pyvenv/bin/python
STAMP=$(date -u +%Y%m%dT%H%MZ)
echo "stamp $STAMP"
cargo build --release -p andrea-cli --bin andrea --locked 2>&1 | tail -1
cargo build --release -p andrea-cpu --example peaks --example gemm_kernels --locked 2>&1 | tail -1
echo "== side by side avx512 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
python3 benches/side_by_side.py --no-build --compile auto --compile-timeout 300 --out benches/results/${STAMP}-amd > /work/m-avx512.log 2>&1
echo "== side by side avx2 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
ANDREA_SIMD=avx2 python3 benches/side_by_side.py --no-build --compile off --out benches/results/${STAMP}-amd-avx2 > /work/m-avx2.log 2>&1
echo "== gemm $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
mkdir -p benches/results/${STAMP}-amd-gemm
( echo "# cargo run --release -p andrea-cpu --example gemm_kernels -- --threads 2 --rounds 3 --kernels gemm,avx512,avx2  (load $(cut -d' ' -f1 /proc/loadavg))"
  target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels gemm,avx512,avx2
  echo "# benches/pytorch/cpu_gemm.py --threads 2 --rounds 3 (MKL via torch.matmul; load $(cut -d' ' -f1 /proc/loadavg))"
  $PYTHON benches/pytorch/cpu_gemm.py --threads 2 --rounds 3
  echo "# peaks (load $(cut -d' ' -f1 /proc/loadavg))"
  target/release/examples/peaks --threads 2
) > benches/results/${STAMP}-amd-gemm/gemm.jsonl 2>&1
echo "== done $(date -u +%T)"
