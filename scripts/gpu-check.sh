#!/usr/bin/env bash
# Runs andrea's pre-built CUDA checks on a machine with an NVIDIA GPU and prints a table.
# Needs no Rust: build the bundle on a development machine with
#   cargo xtask gpu-bundle        # -> target/gpu-bundle/{run.sh,bin/,andrea,bench/,configs/}
# copy target/gpu-bundle/ here, then run ./run.sh (this script) inside it.
#
# Rows of the table:
#   bin/*                     test binaries, run with ANDREA_REQUIRE_DEVICE=1 (a missing GPU
#                             is a failure, not a skip); extra arguments are passed to them
#                             (e.g. a test-name filter)
#   andrea ...                the release `andrea` binary with --backend cuda: training and
#                             decoding throughput of the tiny model and of ANDREA-120M
#   bench/ops                 the ops bench's CUDA columns (criterion results in
#                             results/criterion: copy them back and run
#                             `cargo xtask bench-report results/criterion`)
# Set ANDREA_SKIP_BENCH=1 to run the tests only. Logs go to logs/<row>.log.
# Exit status: 0 when every row passed.
set -uo pipefail
cd "$(dirname "$0")"

export ANDREA_REQUIRE_DEVICE=1
export RUST_BACKTRACE=1
# The CLI's test runs this binary, not the path it was built at.
export ANDREA_BIN="$PWD/andrea"
export CRITERION_HOME="$PWD/results/criterion"
mkdir -p logs results

echo "== device"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
else
    echo "nvidia-smi not found"
fi

shopt -s nullglob
bins=(bin/*)
if [ ${#bins[@]} -eq 0 ]; then
    echo "no test binaries under bin/ (run cargo xtask gpu-bundle on the build machine)"
    exit 2
fi

total_pass=0 total_fail=0 status=0
rows=()
logs=()

# row NAME LOG RC SECS PASS FAIL NOTE
row() {
    local name=$1 log=$2 rc=$3 secs=$4 pass=$5 fail=$6 note=$7
    local skip verdict=ok
    skip=$(grep -c '^SKIPPED' "$log")
    if [ "$rc" -ne 0 ]; then verdict="FAIL (exit $rc)"; status=1; fi
    [ -n "$note" ] && verdict="$verdict  $note"
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    rows+=("$(printf '%-40s %7s %7s %8s %6ss  %s' "$name" "$pass" "$fail" "$skip" "$secs" "$verdict")")
    logs+=("$log")
}

for b in "${bins[@]}"; do
    name=$(basename "$b")
    log="logs/$name.log"
    start=$(date +%s)
    "$b" --test-threads=1 "$@" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    # libtest's summary: "test result: ok. 12 passed; 0 failed; ..."
    pass=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
    fail=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
    row "$name" "$log" "$rc" "$secs" "$pass" "$fail" ""
done

# cmd NAME ARGS...: one command as one row (passed 1 or failed 1); the note is the
# throughput of `andrea bench --json`.
cmd() {
    local name=$1; shift
    local log="logs/$name.log"
    local start rc secs note=""
    start=$(date +%s)
    "$@" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if grep -q '"tokens_per_s"' "$log"; then
        note=$(grep -Eo '"tokens_per_s":[0-9.e+-]+' "$log" | tail -1 | awk -F: '{printf "%.0f tokens/s", $2}')
    fi
    if [ "$rc" -eq 0 ]; then
        row "$name" "$log" 0 "$secs" 1 0 "$note"
    else
        row "$name" "$log" "$rc" "$secs" 0 1 "$note"
    fi
}

if [ -x ./andrea ]; then
    cmd "andrea-info-120m" ./andrea --backend cuda info --config configs/andrea-120m.toml --batch-size 16 --seq-len 1024
    if [ "${ANDREA_SKIP_BENCH:-0}" = 0 ]; then
        cmd "andrea-bench-train-tiny" ./andrea --backend cuda bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --json
        # The issue's figure: ANDREA-120M at batch 16 x 1024 (11.6 GiB by `andrea info`).
        cmd "andrea-bench-train-120m-16x1024-tf32" ./andrea --backend cuda bench train --config configs/andrea-120m.toml --batch-size 16 --seq-len 1024 --steps 5 --json
        cmd "andrea-bench-train-120m-16x1024-fp32" ./andrea --backend cuda --precision fp32 bench train --config configs/andrea-120m.toml --batch-size 16 --seq-len 1024 --steps 3 --json
        cmd "andrea-bench-train-120m-16x1024-bf16" ./andrea --backend cuda --precision bf16 bench train --config configs/andrea-120m.toml --batch-size 16 --seq-len 1024 --steps 3 --json
        # The largest batch that fits: double from 32 until a step fails (out of memory is
        # a clean error naming it, not a crash). Passing sizes get their own rows; the
        # first that fails is expected, so it is a note on the summary row, not a failure.
        largest=16 stop=""
        if ! grep -q '"tokens_per_s"' logs/andrea-bench-train-120m-16x1024-tf32.log; then
            largest=none stop="16 x 1024 failed"
        fi
        for b in 32 64 128 256; do
            [ "$largest" = none ] && break
            log="logs/andrea-bench-train-120m-${b}x1024-tf32.log"
            start=$(date +%s)
            if ./andrea --backend cuda bench train --config configs/andrea-120m.toml \
                --batch-size "$b" --seq-len 1024 --steps 2 --warmup 1 --json >"$log" 2>&1; then
                note=$(grep -Eo '"tokens_per_s":[0-9.e+-]+' "$log" | tail -1 | awk -F: '{printf "%.0f tokens/s", $2}')
                row "andrea-bench-train-120m-${b}x1024-tf32" "$log" 0 $(( $(date +%s) - start )) 1 0 "$note"
                largest=$b
            else
                stop="${b} x 1024 failed: $(grep -m1 -E 'error' "$log" | cut -c1-80)"
                break
            fi
        done
        printf 'largest batch that fits: %s x 1024\n%s\n' "$largest" "$stop" >logs/largest-batch.log
        row "andrea-120m-largest-batch" logs/largest-batch.log 0 0 1 0 "${largest} x 1024 (${stop:-256 x 1024 fit})"
        cmd "andrea-bench-decode-120m" ./andrea --backend cuda bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 64 --json
    fi
fi
if [ -x bench/ops ] && [ "${ANDREA_SKIP_BENCH:-0}" = 0 ]; then
    # Only the CUDA columns (criterion filters on the benchmark id).
    cmd "bench-ops-cuda" bench/ops --bench cuda-
fi

echo
echo "== results"
printf '%-40s %7s %7s %8s %7s  %s\n' check passed failed skipped time status
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "$total_pass passed, $total_fail failed"
if [ "$status" -ne 0 ]; then
    echo
    echo "== failures (first lines of each failing log)"
    for log in "${logs[@]}"; do
        if grep -q 'FAILED\|panicked\|^error' "$log"; then
            echo "--- $log"
            grep -E 'panicked|FAILED|out of tolerance|error' "$log" | head -20
        fi
    done
fi
exit "$status"
