#!/usr/bin/env python3
"""OpenBLAS (through numpy) on the GEMM shapes of benches/benches/ops.rs, as a peer.

Optional, not run by CI. Run it right after `cargo bench -p andrea-benches --bench ops -- gemm/`
so both see the same machine state:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=2 \
        python3 benches/peers/numpy_gemm.py

(The machine's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE settings exist for old OpenBLAS builds
and slow a current one down; unset both for this command only.) Prints one line per shape:
name, median GFLOP/s over 15 runs, and the kernel OpenBLAS picked.
"""
import time

import numpy as np

BT, C, V = 1024, 768, 8449
# (name, m, k, n, a transposed, b transposed): as in benches/benches/ops.rs
GEMMS = [
    ("fwd_qkv", BT, C, 3 * C, False, False),
    ("fwd_attn_proj", BT, C, C, False, False),
    ("fwd_fc", BT, C, 4 * C, False, False),
    ("fwd_fc_proj", BT, 4 * C, C, False, False),
    ("fwd_lm_head", BT, C, V, False, True),
    ("bwd_dx_qkv", BT, 3 * C, C, False, True),
    ("bwd_dw_qkv", C, BT, 3 * C, True, False),
    ("bwd_dx_fc_proj", BT, C, 4 * C, False, True),
    ("bwd_dw_fc_proj", 4 * C, BT, C, True, False),
    ("bwd_dx_lm_head", BT, V, C, False, False),
    ("bwd_dwte_lm_head", V, BT, C, True, False),
]


def main():
    try:
        from threadpoolctl import threadpool_info

        info = [(i.get("internal_api"), i.get("num_threads"), i.get("architecture")) for i in threadpool_info()]
    except ImportError:
        info = "threadpoolctl not installed"
    print(f"numpy {np.__version__}; BLAS pools: {info}")
    rng = np.random.default_rng(0)
    for name, m, k, n, ta, tb in GEMMS:
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        a = a.T if ta else a
        b = b.T if tb else b
        out = np.empty((m, n), dtype=np.float32)
        np.matmul(a, b, out=out)
        times = []
        for _ in range(15):
            t = time.perf_counter()
            np.matmul(a, b, out=out)
            times.append(time.perf_counter() - t)
        med = sorted(times)[len(times) // 2]
        print(f"{name}_{m}x{k}x{n}\t{2 * m * k * n / med / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
