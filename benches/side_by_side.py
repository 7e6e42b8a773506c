#!/usr/bin/env python3
"""andrea against PyTorch's fastest CPU set-up, side by side, in one sitting.

    PYTHON=/path/to/venv/bin/python benches/side_by_side.py            # AVX-512 where present
    ANDREA_SIMD=avx2 PYTHON=... benches/side_by_side.py --compile off   # andrea capped at AVX2

For each of four measurements (train ANDREA-120M B4 x T256, train tiny B8 x T256, decode
ANDREA-120M and tiny at batch 1) it runs andrea and PyTorch alternately, A B A B A, and
prints the ratio table with the machine's CPU flags and peaks, measured in the same run
(`cargo run --release -p andrea-cpu --example peaks`: the f32 FMA peak at 256 and 512
bits and a read-only stream over 2 GiB, before and after the runs; the higher of the two
is the peak). Training's % of peak is andrea's FLOPs per second (FLOPs per token from
`andrea info --json`) over the FMA peak of the widest instruction set andrea's own kernels
use (`ANDREA_SIMD`); decode's % of DRAM bandwidth is the weights' bytes read per token
(every parameter but the unread rows of the position table, f32) times tokens/s over the
read stream; weights that fit the last-level cache (`machine.json`'s `llc_bytes`) are
not read from memory, so theirs is against a stream over 8 MiB, which that cache holds
(tables rebuilt from sittings before that probe mark them "in cache").

The peer is `benches/pytorch/train_step.py --peer fast` (gelu_pytorch_tanh, fused AdamW,
2 threads). `--compile both` (default) runs the peer eager and under `torch.compile`
(a compiled run that takes longer than `--compile-timeout` s to warm up is dropped and
recorded) in the same alternation, andrea, eager, compiled, andrea, eager, compiled,
andrea, and puts andrea against the faster of the two. `--compile auto` instead runs one
eager and one compiled run first and keeps the faster for an A B A B A alternation;
`--compile on|off` fixes it. `--peer old` measures the first configuration instead.
`--rounds N` (default 2) alternates N times before andrea's last run (A B A B ... A: N + 1
runs of andrea, N of each peer set-up), for a longer sitting on a host whose speed swings.

Raw outputs go to `benches/results/<UTC stamp>[-<ANDREA_SIMD>]/`: `runs.jsonl` (every
run's JSON object with the 1-minute load average before it), `peaks.jsonl`,
`machine.json` (CPU model and flags, kernel, torch and transformers versions, the commit) and
`table.md` (what is printed). Ratio: the median of andrea's runs (three by default) over
the mean of PyTorch's (two; eager or compiled, whichever mean is higher; each run's figure is itself
the median of its timed iterations). Beside it, for hosts whose speed swings: the same
median over the peer's single best run of that set-up (its `--compile auto` calibration
run included), the paired ratios (each alternated run of that set-up against the geometric
mean of the andrea runs just before and after it: their median and range, which a swing of
the host lasting a few minutes moves less, as it moves both runs of a pair), and each
side's spread (fastest over slowest run); a row spread more than
10% is marked unsteady, and a target met on the means but not against the peer's best
run says so. A missed target says what it would need of andrea on this host: the
target ratio times the peer's share of the row's bound (FMA peak, read stream); over
100% it is out of reach against that peer there, whatever the kernels (unless the bound
is soft: a decode whose weights are less than twice the last-level cache, part of them
served from it, is marked so instead). When the FMA or read probes before and after the runs differ by more than
10%, the table says so and lists both (its % of peak columns take the higher). `--table-from DIR` rebuilds the table from a sitting's raw outputs alone
into `DIR/table.rebuilt.md`, so any committed table can be checked.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
ANDREA = os.path.join(ROOT, "target/release/andrea")
PEAKS = os.path.join(ROOT, "target/release/examples/peaks")
PEER = os.path.join(ROOT, "benches/pytorch/train_step.py")

# (key, label, config, train?, batch, steps, warmup, target ratio)
SPECS = [
    ("train_120m", "train ANDREA-120M B4 x T256", "configs/andrea-120m.toml", True, 4, 5, 2, 1.15),
    ("train_tiny", "train tiny B8 x T256", "configs/tiny.toml", True, 8, 20, 3, 2.5),
    ("decode_120m", "decode ANDREA-120M batch 1", "configs/andrea-120m.toml", False, 1, 64, 8, 1.5),
    ("decode_tiny", "decode tiny batch 1", "configs/tiny.toml", False, 1, 500, 20, 5.0),
]
SEQ = 256
# The read stream: over 2 GiB (no cache holds it: the DRAM bandwidth, the denominator)
# and over 350 MiB (about ANDREA-120M's weights, shown beside it).
READ_MB = 2048
READ_MB_WEIGHTS = 350
# And over 8 MiB (about the tiny model's 7.5 MB of weights), which the last-level cache
# holds: the denominator of a decode whose weights fit that cache.
READ_MB_CACHE = 8
# A row whose runs (either side's; the peer's calibration run included) spread more than
# this, fastest over slowest, is marked unsteady.
UNSTEADY = 0.10


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_json(cmd, env=None, timeout=None):
    """Runs `cmd`, returns (the last JSON line of stdout or None, exit status)."""
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 and not lines:
        sys.stderr.write(p.stderr[-2000:])
    return (json.loads(lines[-1]) if lines else None), p.returncode


def andrea_cmd(spec, threads):
    key, _, cfg, train, batch, steps, warmup, _ = spec
    kind = "train" if train else "decode"
    return [ANDREA, "--threads", str(threads), "bench", kind, "--config", cfg,
            "--batch-size", str(batch), "--seq-len", str(SEQ), "--steps", str(steps),
            "--warmup", str(warmup), "--json"]


def peer_env():
    """The peer's environment: under `ANDREA_SIMD=avx2`, PyTorch capped at AVX2 too
    (`ATEN_CPU_CAPABILITY=avx2` for its own kernels, `MKL_ENABLE_INSTRUCTIONS=AVX2` for
    MKL's GEMMs), so both sides run what an AVX2-only machine would. (Added after the
    first AVX2 run, 2026-12-02 00:29, whose peer was not capped.)"""
    env = dict(os.environ)
    if os.environ.get("ANDREA_SIMD", "").lower() == "avx2":
        env.setdefault("ATEN_CPU_CAPABILITY", "avx2")
        env.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    return env


def peer_cmd(args, spec, compiled):
    key, _, cfg, train, batch, steps, warmup, _ = spec
    cmd = [args.python, PEER, "--config", cfg, "--batch-size", str(batch), "--seq-len",
           str(SEQ), "--steps", str(steps), "--warmup", str(warmup), "--threads",
           str(args.threads), "--peer", args.peer]
    if not train:
        cmd.append("--decode")
    if compiled:
        cmd += ["--compile", "--compile-timeout", str(args.compile_timeout)]
    return cmd


def machine(args):
    info = {"utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "flags", "cpu family", "model") and k not in info:
                info[k] = v.strip()
    info["nproc"] = os.cpu_count()
    info["llc_bytes"] = last_level_cache_bytes()
    info["kernel"] = os.uname().release
    info["ANDREA_SIMD"] = os.environ.get("ANDREA_SIMD")
    # The code measured: the commit, and whether the work tree differed from it.
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
    info["commit"] = git("rev-parse", "HEAD") or "?"
    info["work_tree_changed"] = bool(git("status", "--porcelain", "--untracked-files=no"))
    v = subprocess.run([args.python, "-c", "import torch, transformers; print(torch.__version__,"
                        " transformers.__version__, torch.backends.cpu.get_cpu_capability())"],
                       capture_output=True, text=True)
    info["torch"], info["transformers"], info["torch_cpu_capability"] = (
        v.stdout.split() + ["?", "?", "?"])[:3]
    return info


def last_level_cache_bytes():
    """The largest cache Linux lists for CPU 0 (`/sys/.../cache/index*/size`), or None."""
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    for d in (os.listdir(base) if os.path.isdir(base) else []):
        try:
            with open(os.path.join(base, d, "size")) as f:
                v = f.read().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
        digits = v.rstrip("KMG")
        if digits.isdigit():
            best = max(best or 0, int(digits) * mult)
    return best


def weights_bytes_per_token(cfg_path, params):
    """f32 bytes a decode step reads: every parameter (`andrea info`'s count) except the
    position table's rows other than the one in use (the embedding lookup reads one row of
    wte too, but wte is also the output layer's weight, read whole)."""
    with open(os.path.join(ROOT, cfg_path), "rb") as f:
        m = tomllib.load(f)["model"]
    return 4 * (params - (m["context_length"] - 1) * m["d_model"])


def flops_per_token(cfg_path, batch):
    info, rc = run_json([ANDREA, "info", "--config", cfg_path, "--seq-len", str(SEQ),
                         "--batch-size", str(batch), "--json"])
    if not info:
        raise SystemExit(f"`andrea info` failed ({rc})")
    return info["training_flops_per_token"], info["parameters"]


def fmt(x):
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_paired(ratios):
    """The median of a row's paired ratios and their range (one pair: the ratio)."""
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=os.environ.get("PYTHON", "python3"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer", choices=["fast", "old"], default="fast")
    ap.add_argument("--compile", choices=["auto", "both", "on", "off"], default="both")
    ap.add_argument("--compile-specs", default=None,
                    help="with --compile both|auto: only these keys of SPECS (the others eager)")
    ap.add_argument("--compile-timeout", type=float, default=300)
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternations per measurement: andrea runs N + 1 times, each peer "
                         "set-up N times (default 2: A B A B A)")
    ap.add_argument("--only", default=None, help="comma-separated keys of SPECS to run")
    ap.add_argument("--calibrate-only", action="store_true",
                    help="only the torch.compile calibration (eager, compiled, eager, "
                         "compiled per measurement), no andrea runs")
    ap.add_argument("--no-build", action="store_true", help="use the built binaries as they are")
    ap.add_argument("--out", default=None)
    ap.add_argument("--table-from", default=None, metavar="DIR",
                    help="only rebuild the table from the raw outputs in DIR, into "
                         "DIR/table.rebuilt.md (needs the andrea binary for `andrea info`'s "
                         "counts)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.table_from:
        if not os.path.exists(ANDREA):
            sys.exit(f"side_by_side: {ANDREA} not built (`cargo build --release -p andrea-cli`)")
        write_table(os.path.abspath(args.table_from),
                    f"rebuilt by `side_by_side.py --table-from {args.table_from}`",
                    args.threads, "as recorded", "table.rebuilt.md")
        return
    simd = os.environ.get("ANDREA_SIMD")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%MZ")
    out = args.out or os.path.join(ROOT, "benches/results", stamp + (f"-{simd}" if simd else ""))
    os.makedirs(out, exist_ok=True)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "andrea-cli", "--bin", "andrea"],
                       cwd=ROOT, check=True)
        subprocess.run(["cargo", "build", "--release", "-p", "andrea-cpu", "--example", "peaks"],
                       cwd=ROOT, check=True)
    missing = [b for b in (ANDREA, PEAKS) if not os.path.exists(b)]
    if missing:
        sys.exit(f"side_by_side: {', '.join(missing)} not built; run without --no-build "
                 "(it builds them) or build them first")
    specs = [s for s in SPECS if not args.only or s[0] in args.only.split(",")]
    info = machine(args)
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump(info, f, indent=1)
    runs = open(os.path.join(out, "runs.jsonl"), "a")
    peaks_f = open(os.path.join(out, "peaks.jsonl"), "a")

    def record(fh, obj, la):
        obj = {"load_1min": la, **obj}
        fh.write(json.dumps(obj) + "\n")
        fh.flush()
        return obj

    def peaks():
        la = load()
        p, rc = run_json([PEAKS, "--threads", str(args.threads), "--read-mb",
                          f"{READ_MB_CACHE},{READ_MB_WEIGHTS},{READ_MB}"])
        if not p:
            raise SystemExit(f"peaks failed ({rc})")
        print(f"peaks: FMA {p['fma_256_gflops']:.1f} (256-bit) / {p['fma_512_gflops']} "
              f"(512-bit) GFLOP/s, read {p['read_gbps'][str(READ_MB)]:.1f} GB/s (load {la})",
              flush=True)
        return record(peaks_f, p, la)

    p0 = peaks()
    for spec in specs:
        key, label = spec[0], spec[1]
        compiled = args.compile == "on"
        if args.calibrate_only:
            for c in (False, True, False, True):
                la = load()
                r, rc = run_json(peer_cmd(args, spec, c), env=peer_env(),
                                 timeout=args.compile_timeout + 600 if c else None)
                r = r or {"implementation": "pytorch", "compile": c, "error": f"exit {rc}"}
                record(runs, {"spec": key, "phase": "compile-calibration", **r}, la)
                print(f"{label}: compile={c}: {r.get('tokens_per_s', r.get('error'))} "
                      f"(warm-up {r.get('compile_warmup_s')} s, load {la})", flush=True)
            continue
        if args.compile == "auto":
            figs = {}
            for c in (False, True):
                la = load()
                r, rc = run_json(peer_cmd(args, spec, c), env=peer_env(),
                                 timeout=args.compile_timeout + 600 if c else None)
                r = r or {"implementation": "pytorch", "compile": c, "error": f"exit {rc}"}
                record(runs, {"spec": key, "phase": "compile-calibration", **r}, la)
                figs[c] = r.get("tokens_per_s") if "error" not in r else None
            compiled = bool(figs[True] and figs[False] and figs[True] > figs[False])
            print(f"{label}: peer eager {figs[False]}, compiled {figs[True]} tokens/s: "
                  f"{'compiled' if compiled else 'eager'} kept", flush=True)
        both = args.compile == "both" and (
            not args.compile_specs or key in args.compile_specs.split(","))
        cell = {"andrea": [], "pytorch": [], "pytorch_compiled": [], "compile": compiled}
        order = (("andrea", "pytorch", "pytorch_compiled") if both else ("andrea", "pytorch")
                 ) * args.rounds + ("andrea",)
        for who in order:
            la = load()
            cmd = (andrea_cmd(spec, args.threads) if who == "andrea" else
                   peer_cmd(args, spec, compiled or who == "pytorch_compiled"))
            r, rc = run_json(cmd, env=None if who == "andrea" else peer_env(),
                             timeout=args.compile_timeout + 900)
            if who == "pytorch_compiled" and (not r or "tokens_per_s" not in r):
                # Over the time box or failed: recorded, and the eager figures stand.
                r = r or {"implementation": "pytorch", "compile": True, "error": f"exit {rc}"}
                record(runs, {"spec": key, "phase": "alternation", **r}, la)
                print(f"  {label}: {who} gave no figure ({r.get('error')})", flush=True)
                continue
            if not r or "tokens_per_s" not in r:
                raise SystemExit(f"{label}: {who} failed ({rc}): {cmd}")
            record(runs, {"spec": key, "phase": "alternation", **r}, la)
            cell[who].append(r["tokens_per_s"])
            print(f"  {label}: {who} {r['tokens_per_s']:.1f} tokens/s (load {la})", flush=True)
    p1 = peaks()
    if args.calibrate_only:
        return
    write_table(out, f"`{' '.join(sys.argv)}`", args.threads, args.compile, "table.md")


def write_table(out, command, threads, compile_mode, name):
    """Builds the ratio table from a sitting's raw outputs in `out` (`runs.jsonl`,
    `peaks.jsonl`, `machine.json`), prints it and writes it to `out/name`: `table.md` at
    the end of a sitting, `table.rebuilt.md` for `--table-from DIR`, which rebuilds it
    from a committed sitting alone and leaves the printed `table.md` as it was."""
    with open(os.path.join(out, "machine.json")) as f:
        info = json.load(f)
    with open(os.path.join(out, "peaks.jsonl")) as f:
        peaks_all = [json.loads(l) for l in f if l.strip()]
    with open(os.path.join(out, "runs.jsonl")) as f:
        runs = [json.loads(l) for l in f if l.strip()]
    if not peaks_all or not runs:
        raise SystemExit(f"side_by_side: {out} holds no peaks or no runs")
    simd = info.get("ANDREA_SIMD")
    peer_mode = next((r.get("peer") for r in runs if r.get("implementation") == "pytorch"),
                     "fast")
    level = simd or ("avx512" if "avx512f" in info.get("flags", "") else "avx2")
    fma = {w: max(p[f"fma_{w}_gflops"] or 0 for p in peaks_all) for w in ("256", "512")}
    fma_used = fma["512"] if level == "avx512" else fma["256"]
    dram = max(p["read_gbps"][str(READ_MB)] for p in peaks_all)
    read_w = max(p["read_gbps"][str(READ_MB_WEIGHTS)] for p in peaks_all)
    # Sittings before the cache probe (rebuilt tables) have none.
    read_c = max((p["read_gbps"].get(str(READ_MB_CACHE), 0) for p in peaks_all), default=0)
    # The same streams on 4 KiB pages (peaks measures both since 2026-12-02).
    dram_4k = max((p.get("read_gbps_4k") or {}).get(str(READ_MB), 0) for p in peaks_all)
    simd_flags = " ".join(f for f in info.get("flags", "").split()
                          if f.startswith(("avx", "amx")) or f == "fma")
    lines = [
        f"Side by side, {info['utc']}, {command}"
        + (f" with ANDREA_SIMD={simd}" if simd else ""),
        "",
        f"Machine: {info.get('model name')} ({info['nproc']} cores), flags: {simd_flags}; "
        f"torch {info['torch']} ({info['torch_cpu_capability']}), transformers "
        f"{info['transformers']}; {threads} threads each.",
        f"Peaks (same run, best of before/after): FMA f32 {fma['256']:.1f} GFLOP/s at 256 "
        f"bits, {fma['512']:.1f} at 512; read-only stream over {READ_MB} MiB "
        f"{dram:.1f} GB/s ({read_w:.1f} over {READ_MB_WEIGHTS} MiB), both on transparent "
        f"huge pages as andrea's buffers are"
        + (f" ({dram_4k:.1f} over {READ_MB} MiB on 4 KiB pages)" if dram_4k else "")
        + f". andrea's kernels at "
        f"`{level}`: training's % of peak is against {fma_used:.1f}; decode's % of read "
        f"against the {READ_MB} MiB stream ("
        + (f"weights that fit the {info['llc_bytes'] / 2**20:.0f} MiB last-level cache, the "
           "tiny model's 7.7 MB, against the stream over "
           f"{READ_MB_CACHE} MiB, {read_c:.1f} GB/s, which that cache holds)."
           if info.get("llc_bytes") and read_c else
           f"weights that fit the {info['llc_bytes'] / 2**20:.0f} MiB last-level cache are "
           "marked in cache: the tiny model's 7.7 MB, whose share of the stream says little)."
           if info.get("llc_bytes") else
           "the tiny model's 7.7 MB of weights stay in cache, so its share says little)."),
        f"Peer: `train_step.py --peer {peer_mode}` (gelu_pytorch_tanh + AdamW(fused=True), "
        "THP_MEM_ALLOC_ENABLE=1"
        if peer_mode == "fast" else "Peer: `train_step.py --peer old` (gelu_new + default AdamW",
    ]
    lines[-1] += f"), torch.compile: {compile_mode}.\n"
    # Runs per side as recorded (3 and 2 unless the sitting had another --rounds): the
    # most of any measurement, the peer's counted per set-up (eager, compiled).
    alternation = [r for r in runs if r.get("phase") == "alternation" and "tokens_per_s" in r]
    def most(implementation, compiled=None):
        return max([sum(1 for r in alternation if r.get("spec") == spec[0]
                        and r.get("implementation") == implementation
                        and (compiled is None or bool(r.get("compile")) == compiled))
                    for spec in SPECS] or [0])
    count = {"andrea": most("andrea"), "pytorch": max(most("pytorch", c) for c in (False, True))}
    lines += [f"| measurement | andrea ({count['andrea']} runs) | PyTorch ({count['pytorch']} runs) "
              "| ratio | target | andrea % of peak | PyTorch % of peak | against the peer's "
              "best run | paired | spread |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    unsteady = False
    for spec in SPECS:
        key, label, cfg, train, batch = spec[:5]
        mine = [r for r in runs if r.get("spec") == key]
        timed = [r for r in mine if r.get("phase") == "alternation" and "tokens_per_s" in r]
        andrea = [r["tokens_per_s"] for r in timed if r.get("implementation") == "andrea"]
        eager = [r["tokens_per_s"] for r in timed
                 if r.get("implementation") == "pytorch" and not r.get("compile")]
        comp = [r["tokens_per_s"] for r in timed
                if r.get("implementation") == "pytorch" and r.get("compile")]
        if not andrea or not (eager or comp):
            continue
        a = statistics.median(andrea)
        # The strongest peer of the sitting: eager or compiled, whichever mean was higher.
        p_eager = statistics.mean(eager) if eager else 0
        p_comp = statistics.mean(comp) if comp else 0
        p = max(p_eager, p_comp)
        kept_compiled = p_comp > p_eager
        ratio = a / p
        # Every run of the kept set-up, its calibration run (`--compile auto`) included:
        # on a host whose speed swings, the peer's best run bounds what its mean hides.
        kept = comp if kept_compiled else eager
        calib = [r["tokens_per_s"] for r in mine
                 if r.get("phase") == "compile-calibration" and "tokens_per_s" in r
                 and bool(r.get("compile")) == kept_compiled]
        best = max(kept + calib)
        # Paired: each run of the kept set-up against the andrea runs on either side of
        # it (their geometric mean), in the order the sitting ran them; a swing of the
        # host that lasts a few minutes moves both sides of a pair alike.
        paired = []
        for i, r in enumerate(timed):
            if (r.get("implementation") != "pytorch"
                    or bool(r.get("compile")) != kept_compiled):
                continue
            before = [x for x in timed[:i] if x.get("implementation") == "andrea"]
            after = [x for x in timed[i + 1:] if x.get("implementation") == "andrea"]
            if before and after:
                a2 = before[-1]["tokens_per_s"] * after[0]["tokens_per_s"]
                paired.append(a2 ** 0.5 / r["tokens_per_s"])
        spread = lambda xs: max(xs) / min(xs) - 1
        s_a, s_p = spread(andrea), spread(kept + calib)
        # The peer's share of the row's bound (FMA peak, read stream), where there is one:
        # a ratio above 1 / that share would need andrea past the bound.
        peer_share, bound, hard = None, None, True
        if train:
            fpt, _ = flops_per_token(cfg, batch)
            pa, pp = a * fpt / 1e9 / fma_used, p * fpt / 1e9 / fma_used
            pct = f"{100 * pa:.0f}% of FMA", f"{100 * pp:.0f}% of FMA"
            peer_share, bound = pp, "the FMA peak"
        else:
            wb = weights_bytes_per_token(cfg, flops_per_token(cfg, batch)[1])
            pct = (f"{100 * a * wb / 1e9 / dram:.0f}% of read",
                   f"{100 * p * wb / 1e9 / dram:.0f}% of read")
            peer_share, bound = p * wb / 1e9 / dram, "the read stream"
            # Weights less than twice the last-level cache are partly served from it
            # token after token (the Emerald Rapids host's 260 MB L3 and ANDREA-120M's
            # 366 MB: both sides read past the stream), so the stream bounds nothing hard.
            llc = info.get("llc_bytes") or 0
            hard = not (llc and wb < 2 * llc)
            if info.get("llc_bytes") and wb < info["llc_bytes"]:
                # Weights that fit the last-level cache are not read from memory: their
                # denominator is the stream over a buffer that cache holds.
                if read_c:
                    pct = (f"{100 * a * wb / 1e9 / read_c:.0f}% of cache read",
                           f"{100 * p * wb / 1e9 / read_c:.0f}% of cache read")
                    peer_share, bound = p * wb / 1e9 / read_c, "the cache read stream"
                else:
                    pct = tuple(f"in cache ({x})" for x in pct)
                    peer_share, bound = None, None
        target = spec[7]
        if ratio < target:
            met = "**missed**"
        elif a / best < target:
            met = "met on the means, **missed** against the peer's best run"
        else:
            met = "met"
        if met != "met" and peer_share:
            # What the target asks of andrea on this host: target x the peer's share
            # (of its best run where the target was met on the means only).
            need = target * peer_share * (best / p if ratio >= target else 1)
            met += f"; needs {100 * need:.0f}% of {bound}"
            if need > 1:
                met += (": **out of reach against this peer here**" if hard else
                        " (not a hard bound here: the last-level cache holds part of the "
                        "weights)")
        if kept_compiled and eager:
            peer = (f"eager {', '.join(fmt(x) for x in eager)}; compiled "
                    + ", ".join(fmt(x) for x in comp) + " (faster: used)")
        elif comp and eager:
            peer = (f"eager {', '.join(fmt(x) for x in eager)}; compiled "
                    + ", ".join(fmt(x) for x in comp) + " (slower)")
        else:
            peer = ", ".join(fmt(x) for x in kept) + (" (compiled)" if kept_compiled else "")
        flag = ""
        if max(s_a, s_p) > UNSTEADY:
            unsteady, flag = True, " (unsteady)"
        lines.append(f"| {label} | {', '.join(fmt(x) for x in andrea)} | {peer} | "
                     f"**{ratio:.2f}x** | {target}x: {met} | {pct[0]} | {pct[1]} | "
                     f"{a / best:.2f}x (best {fmt(best)}) | {fmt_paired(paired)} | "
                     f"{100 * s_a:.0f}% / {100 * s_p:.0f}%{flag} |")
    lines.append("\nRatio: the median of andrea's runs over the mean of the faster peer "
                 "set-up's runs. Against the peer's best run: the same median over the "
                 "fastest single run of that set-up, its calibration run included. Paired: "
                 "each of that set-up's alternated runs against the geometric mean of the "
                 "andrea runs just before and after it; the median, and the range over the "
                 "pairs. Spread: "
                 "fastest over slowest run, andrea / peer. A missed target says what it "
                 "needs: the target ratio times the peer's % of the row's bound; over 100%, "
                 "no kernel meets it against this peer on this host.")
    # The probes before and after the runs should agree; when they do not, the % of
    # peak columns (against the higher) can mislead, so both are printed.
    def disagree(values):
        values = [v for v in values if v]
        return len(values) > 1 and max(values) > (1 + UNSTEADY) * min(values)
    fma_key = "fma_512_gflops" if level == "avx512" else "fma_256_gflops"
    fma_probes = [p.get(fma_key) for p in peaks_all]
    read_probes = [p["read_gbps"][str(READ_MB)] for p in peaks_all]
    if disagree(fma_probes) or disagree(read_probes):
        listed = lambda vs: ", ".join(f"{v:.1f}" for v in vs if v)
        lines.append(f"**Probes disagree** by more than {100 * UNSTEADY:.0f}%: FMA "
                     f"{listed(fma_probes)} GFLOP/s, read {listed(read_probes)} GB/s (before, "
                     "after). The % of peak columns are against the higher; recompute "
                     "against the lower before quoting them.")
    if unsteady:
        lines.append(f"**Unsteady sitting**: a side's runs spread more than "
                     f"{100 * UNSTEADY:.0f}% in a row marked so; the host's swings, not the "
                     "code, may decide its ratio. Repeat it before quoting it.")
    lines.append(f"\nRaw outputs: {os.path.relpath(out, ROOT)}/")
    text = "\n".join(lines)
    print("\n" + text)
    with open(os.path.join(out, name), "w") as f:
        f.write(text + "\n")

if __name__ == "__main__":
    main()
