#!/usr/bin/env bash
# Runs andrea's pre-built CUDA test binaries on a machine with an NVIDIA GPU and prints
# a table. Needs no Rust: build the bundle on a development machine with
#   cargo xtask gpu-bundle        # -> target/gpu-bundle/{run.sh,bin/}
# copy target/gpu-bundle/ here, then run ./run.sh (this script) inside it.
#
# Every binary runs with ANDREA_REQUIRE_DEVICE=1, so a missing GPU is a failure, not a
# skip. Logs go to logs/<binary>.log. Exit status: 0 when every binary passed.
# Extra arguments are passed to every test binary (e.g. a test-name filter).
set -uo pipefail
cd "$(dirname "$0")"

export ANDREA_REQUIRE_DEVICE=1
export RUST_BACKTRACE=1
mkdir -p logs

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
    skip=$(grep -c '^SKIPPED' "$log")
    verdict=ok
    if [ "$rc" -ne 0 ]; then verdict="FAIL (exit $rc)"; status=1; fi
    total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
    rows+=("$(printf '%-34s %7s %7s %8s %6ss  %s' "$name" "$pass" "$fail" "$skip" "$secs" "$verdict")")
done

echo
echo "== results"
printf '%-34s %7s %7s %8s %7s  %s\n' binary passed failed skipped time status
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "$total_pass passed, $total_fail failed"
if [ "$status" -ne 0 ]; then
    echo
    echo "== failures (first lines of each failing log)"
    for b in "${bins[@]}"; do
        log="logs/$(basename "$b").log"
        if grep -q 'FAILED\|panicked' "$log"; then
            echo "--- $log"
            grep -E 'panicked|FAILED|out of tolerance|error' "$log" | head -20
        fi
    done
fi
exit "$status"
