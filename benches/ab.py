#!/usr/bin/env python3
"""A/B of two `andrea` binaries on one bench command, alternated, with the raw outputs kept.

    cargo build --release -p andrea-cli && cp target/release/andrea /tmp/andrea-old
    # ... make the change ...
    cargo build --release -p andrea-cli && cp target/release/andrea /tmp/andrea-new
    benches/ab.py /tmp/andrea-old /tmp/andrea-new --rounds 8 --out benches/results/<stamp>-<what> \\
        -- bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --steps 20 --warmup 3

Build the CLI with `-p andrea-cli` on its own: `cargo build -p andrea-cli -p andrea-cpu
--examples` builds the examples and leaves `target/release/andrea` as it was, and an A/B
of a binary against itself measures nothing but the host. That happened once in this
project (benches/results/20261203T0733Z-zen3-dw-columns/README.md), so this script
compares the two files' SHA-256 and refuses identical ones, unless `--same` asks for it
on purpose: an A/A run, which measures the host's noise floor for that command.

Rounds run in ABBA order (A B, B A, A B, ...) so a drift of the host over the sitting
falls on both sides alike. Each run is the command with `--json` (added if missing); the
metric is its `tokens_per_s` (`--metric` to pick another number of the JSON object).
Printed and written to `OUT/summary.md`: each side's runs, median and spread
(fastest/slowest), the ratio B/A of each round, the median ratio, how many rounds B won,
and the chance of a result at least that lopsided if the two were the same binary (a
two-sided sign test). `OUT/runs.jsonl` holds every run's JSON object with the binary's
label and hash, the round and the 1-minute load average before it.
"""

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def run_once(binary, args, metric):
    """Runs `binary args`; returns (its last JSON line as a dict, the metric)."""
    p = subprocess.run([binary] + args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"ab.py: `{binary} {' '.join(args)}` exited with {p.returncode}:\n"
                 f"{p.stderr.strip()[-2000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"ab.py: `{binary} {' '.join(args)}` printed no JSON line; "
                 "is it an `andrea bench` command?")
    obj = json.loads(lines[-1])
    if metric not in obj or not isinstance(obj[metric], (int, float)):
        sys.exit(f"ab.py: the JSON of `{binary}` has no number `{metric}` "
                 f"(keys: {', '.join(sorted(obj))}); pick one with --metric")
    return obj, float(obj[metric])


def sign_test(wins, n):
    """Two-sided sign test: the chance of `wins` or a result further from n/2, if each
    round were a coin toss."""
    k = max(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def summarize(label_a, label_b, a_vals, b_vals, metric):
    ratios = [b / a for a, b in zip(a_vals, b_vals)]
    wins = sum(r > 1.0 for r in ratios)
    ties = sum(r == 1.0 for r in ratios)
    n = len(ratios) - ties
    med_a, med_b = statistics.median(a_vals), statistics.median(b_vals)
    spread = lambda v: max(v) / min(v) - 1.0
    out = [
        f"| side | {metric}, round by round | median | spread |",
        "|---|---|---|---|",
        f"| A `{label_a}` | {', '.join(f'{v:,.1f}' for v in a_vals)} | {med_a:,.1f} | "
        f"{spread(a_vals):.1%} |",
        f"| B `{label_b}` | {', '.join(f'{v:,.1f}' for v in b_vals)} | {med_b:,.1f} | "
        f"{spread(b_vals):.1%} |",
        "",
        f"B/A by round: {', '.join(f'{r:.3f}' for r in ratios)}; median "
        f"**{statistics.median(ratios):.3f}**, ratio of medians {med_b / med_a:.3f}; "
        f"B ahead in {wins} of {len(ratios)} rounds"
        + (f" ({ties} tied)" if ties else "")
        + (f"; sign test p = {sign_test(wins, n):.3f}" if n else ""),
    ]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(
        description="A/B two andrea binaries on one bench command (ABBA rounds).",
        usage="%(prog)s A B [options] -- bench train|decode ...")
    ap.add_argument("a", help="the baseline binary")
    ap.add_argument("b", help="the changed binary")
    ap.add_argument("--rounds", type=int, default=6, help="A+B pairs (default 6)")
    ap.add_argument("--out", help="folder for runs.jsonl and summary.md")
    ap.add_argument("--metric", default="tokens_per_s",
                    help="number in the JSON to compare (default tokens_per_s)")
    ap.add_argument("--same", action="store_true",
                    help="allow identical binaries: an A/A run, the host's noise floor")
    ap.add_argument("--label-a", help="name for A (default: its file name)")
    ap.add_argument("--label-b", help="name for B (default: its file name)")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the bench command after `--`, e.g. -- bench train --config configs/tiny.toml")
    cut = argv.index("--")
    args, cmd = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if not cmd:
        ap.error("the bench command after `--` is empty")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if "--json" not in cmd:
        cmd = cmd + ["--json"]
    for p in (args.a, args.b):
        if not (os.path.isfile(p) and os.access(p, os.X_OK)):
            sys.exit(f"ab.py: {p} is not an executable file")
    ha, hb = sha256(args.a), sha256(args.b)
    if ha == hb and not args.same:
        sys.exit(f"ab.py: {args.a} and {args.b} are the same binary (SHA-256 {ha[:16]}...): "
                 "an A/B of them measures only the host. Rebuild the changed one (the CLI "
                 "with `cargo build --release -p andrea-cli`, no `--examples`), or pass "
                 "--same for an A/A run on purpose.")
    label_a = args.label_a or os.path.basename(args.a)
    label_b = args.label_b or os.path.basename(args.b)
    if label_a == label_b:
        label_a, label_b = label_a + " (A)", label_b + " (B)"
    runs = None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        runs = open(os.path.join(args.out, "runs.jsonl"), "a")
    sides = {"A": (args.a, label_a, ha), "B": (args.b, label_b, hb)}
    vals = {"A": [], "B": []}
    print(f"A {label_a} ({ha[:12]}), B {label_b} ({hb[:12]}); {args.rounds} rounds of: "
          f"andrea {' '.join(cmd)}", flush=True)
    for r in range(args.rounds):
        for side in ("AB" if r % 2 == 0 else "BA"):
            binary, label, h = sides[side]
            load = load1()
            obj, v = run_once(binary, cmd, args.metric)
            vals[side].append(v)
            print(f"round {r + 1} {side} {label}: {args.metric} {v:,.2f} (load {load})",
                  flush=True)
            if runs:
                runs.write(json.dumps({"round": r + 1, "side": side, "label": label,
                                       "sha256": h, "load1": load, "command": cmd,
                                       "result": obj}) + "\n")
                runs.flush()
    text = summarize(label_a, label_b, vals["A"], vals["B"], args.metric)
    print()
    print(text)
    if args.out:
        with open(os.path.join(args.out, "summary.md"), "w") as f:
            f.write(f"`benches/ab.py`, {args.rounds} ABBA rounds of `andrea {' '.join(cmd)}`; "
                    f"A {label_a} (SHA-256 {ha[:16]}), B {label_b} ({hb[:16]})"
                    + (" (the same binary: an A/A run)" if ha == hb else "") + "\n\n")
            f.write(text + "\n")


if __name__ == "__main__":
    main()
