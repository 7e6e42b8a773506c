#!/usr/bin/env python3
"""The GPU bundle's summary table (run.sh calls it after every phase): reads rows.jsonl
and prints at most ~100 lines: the phases, every failed check, andrea against its peers
on the same GPU (GEMMs as % of cuBLAS, attention as % of SDPA, training as andrea tok/s
over PyTorch tok/s and as MFU of the H200's 989 TFLOP/s dense BF16 peak, FLOPs counted as
`andrea info` counts them), the training steps side by side, decoding.

    summary.py rows.jsonl                      # the table
    summary.py rows.jsonl --expect A B ...     # also: exit 1 unless every named phase has
                                               # a row and its log is in logs.tar.gz

Only the standard library: it runs wherever run.sh runs.
"""

import json
import os
import sys
import tarfile

PEAK_BF16_TFLOPS = 989.0


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def pct(a, b):
    return "-" if a is None or not b else f"{100.0 * a / b:.0f}%"


def table(rows):
    out = []
    phases = [r for r in rows if r.get("row") == "phase"]
    mode = phases[0].get("mode", "gpu") if phases else "gpu"
    out.append(f"== phases ({mode})")
    for p in phases:
        note = f"  {p['note']}" if p.get("note") else ""
        out.append(f"{p['name']:<26} {p['status']:<8} {p['seconds']:>4}s{note}"[:160])

    checks = [r for r in rows if "pass" in r and r.get("row") != "phase"]
    failed = [r for r in checks if not r["pass"]]
    out.append(f"== checks: {len(checks) - len(failed)} passed, {len(failed)} failed")
    for r in failed[:15]:
        what = r.get("check") or r.get("error") or ""
        out.append(f"FAILED {r.get('run_phase', '?')}: {r.get('name', '')} {r.get('precision', '')} "
                   f"{what} (worst/bound {fmt(r.get('worst_err_over_bound'), 2)})"[:160])

    def speed(phase_prefix, impl, kernel_impl="mma"):
        d = {}
        for r in rows:
            if not r.get("run_phase", "").startswith(phase_prefix) or "tflop_per_s" not in r:
                continue
            if (r.get("implementation") == "pytorch") != (impl == "pytorch"):
                continue
            # Rows without kernel_impl (older runs) and the FP32 (simt) rows count as the
            # default, mma; wmma rows only when asked for.
            if impl != "pytorch" and (r.get("kernel_impl") == "wmma") != (kernel_impl == "wmma"):
                continue
            d[(r["name"], r["precision"])] = r["tflop_per_s"]
        return d

    ours, peer = speed("gemm-check", "andrea"), speed("peer-gemm", "pytorch")
    if ours:
        out.append("== GEMMs, TFLOP/s: andrea (cuBLAS via torch.matmul) [andrea % of cuBLAS]")
        out.append(f"{'product':<20} {'fp32':>22} {'tf32':>22} {'bf16':>22}")
        names = [n for (n, p) in ours if p == "fp32"] or sorted({n for n, _ in ours})
        for n in names:
            cells = []
            for p in ("fp32", "tf32", "bf16"):
                a, b = ours.get((n, p)), peer.get((n, p))
                cells.append(f"{fmt(a)} ({fmt(b)}) [{pct(a, b)}]")
            out.append(f"{n:<20} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22}")

    old = speed("gemm-check", "andrea", "wmma")
    if old:
        out.append("== GEMMs, TFLOP/s, same run: mma (matmul_mma.cu) vs wmma (matmul.cu) [mma % of cuBLAS]")
        out.append(f"{'product':<20} {'tf32 mma / wmma':>22} {'bf16 mma / wmma':>22}")
        for n in dict.fromkeys(n for n, _ in old):
            cells = [f"{fmt(ours.get((n, p)))} / {fmt(old.get((n, p)))} [{pct(ours.get((n, p)), peer.get((n, p)))}]"
                     for p in ("tf32", "bf16")]
            out.append(f"{n:<20} {cells[0]:>22} {cells[1]:>22}")

    stores = [r for r in rows if r.get("run_phase") == "gemm-check" and r.get("direct_median_ms")]
    if stores:
        out.append("== mma output store: ms staged through shared memory (default) vs direct fragment stores, same run")
        for r in stores:
            ms, d = r["median_ms"], r["direct_median_ms"]
            same = "same bits" if r.get("direct_bit_identical") else "BITS DIFFER"
            out.append(f"{r['name']:<20} {r['precision']:<5} {fmt(ms, 3):>9} ms vs {fmt(d, 3):>9} ms direct  "
                       f"{d / ms:.2f}x  {same}")

    split = [r for r in rows if r.get("run_phase") == "gemm-check" and (r.get("split_k") or 1) > 1
             and r.get("kernel_impl", "mma") != "wmma"]
    if split:
        out.append("== split-K (ANDREA_CUDA_SPLIT_K=auto): ms split vs unsplit, same run")
        for r in split:
            ms, un = r["median_ms"], r.get("unsplit_median_ms")
            gain = f"{un / ms:.2f}x" if un else "-"
            out.append(f"{r['name']:<20} {r['precision']:<5} {r['split_k']} slices "
                       f"{fmt(ms, 3):>9} ms vs {fmt(un, 3):>9} ms unsplit  {gain}")

    epi = [r for r in rows if r.get("phase") == "gemm_epilogue" and "median_ms" in r]
    if epi:
        out.append("== fused GELU backward: ms fused vs product + separate gelu_backward, same run")
        for r in epi:
            ms, un = r["median_ms"], r.get("unfused_median_ms")
            gain = f"{un / ms:.2f}x" if un else "-"
            out.append(f"{r['name']:<20} {r['precision']:<5} {fmt(ms, 3):>9} ms vs "
                       f"{fmt(un, 3):>9} ms unfused  {gain}")

    att = [r for r in rows if r.get("run_phase", "").startswith("attention-check") and "tflop_per_s" in r]
    peer = speed("peer-attention", "pytorch")
    if att:
        out.append("== attention, TFLOP/s: andrea (kernel) vs SDPA at the same precision [andrea % of SDPA]")
        total = {}
        for r in att:
            n, p, kern = r["name"], r["precision"], r.get("kernel", "simt")
            b = peer.get((n, p)) or peer.get((n, "bf16" if p != "fp32" else "fp32"))
            out.append(f"{n:<28} andrea {p:<5} {kern:<5} {fmt(r['tflop_per_s'], 2):>8}   "
                       f"SDPA {fmt(b, 2):>8}   {pct(r['tflop_per_s'], b):>5}")
            total.setdefault((p, kern), 0.0)
            total[(p, kern)] += r["median_ms"]
        peer_ms = {}
        for r in rows:
            if r.get("run_phase", "").startswith("peer-attention") and r.get("implementation") == "pytorch" \
                    and "median_ms" in r:
                peer_ms[r["precision"]] = peer_ms.get(r["precision"], 0.0) + r["median_ms"]
        for (p, kern), ms in sorted(total.items()):
            ref = peer_ms.get(p)
            speedup = f"{ref / ms * 100:.0f}% of SDPA's speed" if ref else "no SDPA row"
            goal = "  (target >= 50%)" if p == "bf16" and kern == "mma" else ""
            out.append(f"forward + backward {p:<5} {kern:<5} {fmt(ms, 3):>9} ms vs SDPA "
                       f"{fmt(ref, 3):>9} ms: {speedup}{goal}")

    dec = [r for r in rows if r.get("phase") == "decode_attention" and "median_ms" in r]
    if dec:
        out.append("== decode attention (1 query, KV cache): split-KV kernels vs off (row-tiled), "
                   "ms and K/V GB/s (HBM ~4300)")
        by = {}
        for r in dec:
            by.setdefault((r["name"], r["precision"]), {})[r["kernel"]] = r
        for (n, p), k in by.items():
            s, o = k.get("split"), k.get("off")
            gain = f"{o['median_ms'] / s['median_ms']:.2f}x" if s and o else "-"
            chunks = s.get("chunks") if s else None
            out.append(f"{n:<24} {p:<5} split ({chunks or '-'} chunks) "
                       f"{fmt(s and s['median_ms'], 4):>8} ms {fmt(s and s['gb_per_s'], 0):>6} GB/s   "
                       f"off {fmt(o and o['median_ms'], 4):>8} ms {fmt(o and o['gb_per_s'], 0):>6} GB/s   {gain}")

    trains = [r for r in rows if r.get("bench") == "train_step" and r.get("run_phase", "").startswith("bench-train")]
    peers = [r for r in rows if r.get("phase") == "train" and r.get("implementation") == "pytorch"]
    if trains or peers:
        out.append("== training step: tokens/s, MFU (of 989 TFLOP/s bf16), ratio to PyTorch")
        best = {}
        for r in peers:
            key = r["mode"]
            if r["tokens_per_s"] > best.get(key, {}).get("tokens_per_s", 0):
                best[key] = r
        for r in peers:
            tag = f"pytorch {r['mode']}{' compiled' if r.get('compiled') else ''}"
            out.append(f"{tag:<24} {r['batch']}x{r['seq_len']} {fmt(r['tokens_per_s'], 0):>10} tok/s  "
                       f"MFU {pct(r['gflop_per_s'] / 1e3, PEAK_BF16_TFLOPS)}")
        for r in trains:
            p = r["run_phase"].split("-")[-1]
            ref = best.get("tf32" if p in ("tf32", "fp32") else "bf16")
            ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x pytorch {ref['mode']}" if ref else ""
            out.append(f"{'andrea ' + p:<24} {r['batch']}x{r['seq_len']} {fmt(r['tokens_per_s'], 0):>10} tok/s  "
                       f"MFU {pct(r.get('gflop_per_s', 0) / 1e3, PEAK_BF16_TFLOPS)}  {ratio}")

    steps = [r for r in rows if r.get("phase") == "train_step" and "step" in r]
    if steps:
        out.append("== training steps from one seed: loss / grad norm")
        for r in steps:
            extra = ""
            if "loss_rel_diff_vs_fp32" in r:
                extra = f"  vs fp32: {r['loss_rel_diff_vs_fp32']:.1e} / {r['grad_norm_rel_diff_vs_fp32']:.1e}"
            out.append(f"{r['precision']:<5} step {r['step']}: {r['loss']:.5f} / {r['grad_norm']:.4f}{extra}")

    for r in rows:
        if r.get("phase") == "largest_batch":
            out.append(f"== largest batch that fits: {r['largest_fitting']} x seq (tried {r['tried']})")
        if r.get("bench") == "decode":
            split = "off" if r.get("run_phase", "").endswith("-off") else "split"
            out.append(f"== decode: {fmt(r['tokens_per_s'], 0)} tok/s ({r['config']}, batch {r['batch']}, "
                       f"decode attention {split})")
        if r.get("phase") == "cpu_vs_gpu":
            if "rel_diff" in r:
                detail = f"(rel {r['rel_diff']:.1e})"
            else:
                detail = (f"(argmax agrees at {r['agree_decisive']:.0%} of the {r['decisive']} "
                          f"positions of {r['positions']} beyond the error bound, "
                          f"{r['agree_all']:.0%} of all)")
            out.append(f"== cpu vs gpu: {r['check']}: {'ok' if r['pass'] else 'DIFFERENT'} {detail}")
        if r.get("phase") == "nccl_one_rank":
            out.append(f"== NCCL, one rank: {r['check']}: {'ok' if r['pass'] else 'DIFFERENT'} "
                       f"({r['nccl'] or 'NCCL not used'}; {r['run_s']:.1f}s)")
        if r.get("phase") == "loads" and "all_fatbin" in r:
            out.append(f"== kernels loaded as {'machine code (fatbin)' if r['all_fatbin'] else 'PTX (JIT)'}; "
                       f"backend started in {r['start_s']:.2f}s: {r['backend']}")
    return out


def verify(rows_path, expect):
    rows = load(rows_path)
    names = {r["name"] for r in rows if r.get("row") == "phase"}
    import fnmatch
    missing = [e for e in expect if not fnmatch.filter(names, e)]
    tar = os.path.join(os.path.dirname(rows_path), "logs.tar.gz")
    logs = set()
    if os.path.exists(tar):
        with tarfile.open(tar) as t:
            logs = {os.path.basename(m.name) for m in t.getmembers()}
    no_log = [e for e in expect if not fnmatch.filter(logs, f"{e}.log")]
    for e in missing:
        print(f"phase {e}: no row in {rows_path}", file=sys.stderr)
    for e in no_log:
        print(f"phase {e}: no logs/{e}.log in {tar}", file=sys.stderr)
    return not missing and not no_log


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    rows = load(args[0])
    lines = table(rows)
    print("\n".join(lines[:110]))
    if len(args) > 1 and args[1] == "--expect":
        return 0 if verify(args[0], args[2:]) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
