#!/bin/bash
# The AVX2 GEMM's queue driver (ANDREA_GEMM=avx2) against the per-block split it
# replaces (ANDREA_GEMM=avx2-blocks), one build (/tmp/andrea-q; the two wrappers in this
# folder set the variable): each product alone, then the steps.
cd "$(git rev-parse --show-toplevel)"
D=benches/results/20261203T1100Z-zen3-gemm-queue
target/release/examples/peaks --threads 2 --read-mb 2048 --reps 3 > $D/peaks-before.jsonl
target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels avx2,avx2-blocks > $D/gemm-120m.jsonl 2>&1
target/release/examples/gemm_kernels --threads 2 --rounds 3 --kernels avx2,avx2-blocks --model tiny > $D/gemm-tiny.jsonl 2>&1
python3 benches/ab.py $D/andrea-blocks $D/andrea-queue --rounds 8 --out $D/step-tiny -- bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3 > $D/step-tiny.txt 2>&1
python3 benches/ab.py $D/andrea-blocks $D/andrea-queue --rounds 5 --out $D/step-120m -- bench train --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 3 --warmup 1 > $D/step-120m.txt 2>&1
target/release/examples/peaks --threads 2 --read-mb 2048 --reps 3 > $D/peaks-after.jsonl
