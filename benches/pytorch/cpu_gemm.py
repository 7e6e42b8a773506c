#!/usr/bin/env python3
"""PyTorch's CPU GEMM (MKL / oneDNN behind `torch.matmul`) on the 11 products of an
ANDREA-120M training step at B4 x T256 (1024 rows), the shapes of
`andrea_core::config::step_gemms` and of `cargo run --release -p andrea-cpu --example
gemm_kernels`, so andrea's kernels can be put against the strongest CPU GEMM at hand on
the same machine in the same sitting:

    python benches/pytorch/cpu_gemm.py --threads 2 --rounds 5

One JSON line per shape: the median GFLOP/s over `--rounds` rounds, each round the best
of `--reps` timed calls (after one untimed call). A transposed operand is a transposed
view (`.t()`), which MKL takes as a flag without a copy, as andrea takes strides.
"""

import argparse
import json
import statistics
import time

import torch

TOKENS, C, MLP, V = 1024, 768, 3072, 8449
# (name, m, k, n, a transposed, b transposed): andrea_core::config::step_gemms.
SHAPES = [
    ("fwd_qkv", TOKENS, C, 3 * C, False, False),
    ("fwd_attn_proj", TOKENS, C, C, False, False),
    ("fwd_fc", TOKENS, C, MLP, False, False),
    ("fwd_fc_proj", TOKENS, MLP, C, False, False),
    ("fwd_lm_head", TOKENS, C, V, False, True),
    ("bwd_dx_qkv", TOKENS, 3 * C, C, False, True),
    ("bwd_dw_qkv", C, TOKENS, 3 * C, True, False),
    ("bwd_dx_fc_proj", TOKENS, C, MLP, False, True),
    ("bwd_dw_fc_proj", MLP, TOKENS, C, True, False),
    ("bwd_dx_lm_head", TOKENS, V, C, False, False),
    ("bwd_dwte_lm_head", V, TOKENS, C, True, False),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    for name, m, k, n, ta, tb in SHAPES:
        a = torch.rand((k, m) if ta else (m, k), generator=g) - 0.5
        b = torch.rand((n, k) if tb else (k, n), generator=g) - 0.5
        a = a.t() if ta else a
        b = b.t() if tb else b
        out = torch.empty(m, n)
        torch.matmul(a, b, out=out)
        rounds = []
        for _ in range(args.rounds):
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                torch.matmul(a, b, out=out)
                best = min(best, time.perf_counter() - t0)
            rounds.append(best)
        med = statistics.median(rounds)
        print(json.dumps({
            "bench": "gemm_kernels", "shape": f"{name}_{m}x{k}x{n}", "kernel": "torch",
            "backend": f"torch {torch.__version__} cpu ({args.threads} threads, "
                       f"{torch.backends.cpu.get_cpu_capability()}, mkl "
                       f"{torch.backends.mkl.is_available()})",
            "gflops": round(2 * m * k * n / med / 1e9, 1), "median_s": round(med, 5),
        }), flush=True)


if __name__ == "__main__":
    main()
