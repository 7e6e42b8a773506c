#!/usr/bin/env bash
# The GPU bundle's one script: turns a GPU machine into andrea's correctness and speed
# figures within a time budget. No Rust needed there: build the bundle with
#   cargo xtask gpu-bundle     # -> target/gpu-bundle/ (this script is its run.sh)
# copy the folder over and run ./run.sh inside it.
#
#   ./run.sh [--budget SECONDS] [--emulator]
#
# --budget (default 420): the whole run's wall-clock limit. Phases run in the order
#   below, each under its own `timeout` (its cap, or what is left of the budget if less);
#   a phase that fails or hangs is a row saying so, and the next one runs. A phase that
#   would start with less than its minimum left is a "skipped: budget" row.
# --emulator: the dry run against the CUDA emulator (`cargo xtask cuda-emu`; .ci/run
#   does it): every phase at tiny shapes, so the script never meets a GPU for the first
#   time in a short window.
#
# Results, as they happen, under $OUT (or ./results when OUT is unset; at most 8 files,
# as the GPU lease returns them):
#   rows.jsonl     one JSON line per result: the phase rows ({"row":"phase",...}) and every
#                  measurement or check the phases print, tagged with "run_phase"
#   summary.txt    the table printed at the end (rewritten after every phase)
#   logs.tar.gz    every phase's full log and the criterion data (rewritten after every
#                  phase, so a run killed midway still returns what it had)
# stdout ends with the summary table (at most ~100 lines).
#
# Phases, in the order they run, with their cap and the expected time on an H200 (how the
# estimate is reached is next to each). First what decides the design (the GEMMs, the
# attention, the BF16 training step, and PyTorch's figures for the same work on the same
# GPU), then correctness (the test binaries, the sanitizers, production-shape checks),
# then the rest. Caps add up to more than the budget on purpose: the estimates add up to
# about 380 s before the two time-boxed extras at the end, so a normal run ends inside
# the default 420 s with whatever of the extras fits.
#   device            10 s   (est. 3)   nvidia-smi, driver, how the kernels loaded (fatbin: no JIT)
#   gemm-check        75 s   (est. 28)  11 GEMMs at B·T = 16384 rows in FP32/TF32/BF16,
#                     TF32 and BF16 once on the mma kernels and once on the WMMA ones:
#                     ~1.1 TFLOP per sweep, 12 sweeps per run at 20-400 TFLOP/s,
#                     plus uploads and a host comparison of ~330M floats per precision;
#                     the split-K dW products again unsplit (3 x 0.17 TFLOP x 11 reps),
#                     and every mma product again with the direct output store
#                     (2 x 1.1 TFLOP x 11 reps at ~300 TFLOP/s, and the downloads
#                     to compare bits: ~+2 s)
#   attention-check   60 s   (est. 20)  T = 1024, 12 heads of 64, batch 16: 51 GFLOP
#                     forward, 2.5x backward at ~8 TFLOP/s (SIMT) or ~100-200 (tensor
#                     cores, estimated), 7 reps x 5 runs (FP32; TF32 and BF16 on the
#                     tensor-core kernels and again on the SIMT ones), and the CPU
#                     reference on one sequence (~8 GFLOP on 16 cores)
#   bench-train-bf16  45 s   (est. 15)  andrea bench train, 120M at 16 x 1024, BF16
#                     (2 warm-up + 5 timed steps at 0.35-1 s)
#   peer-gemm         40 s   (est. 12)  torch.matmul (cuBLAS), same 11 shapes, 3 precisions
#   peer-attention    30 s   (est. 10)  scaled_dot_product_attention, bf16 (flash), fp32
#                     with TF32 allowed, and fp32
#   peer-train-bf16   50 s   (est. 20)  GPT2LMHeadModel as ANDREA-120M, 16 x 1024, AdamW,
#                     bf16 autocast, eager
#   test-*            60 s each (est. 60 in all) the test binaries, ANDREA_REQUIRE_DEVICE=1
#   sanitizer-*       30 s each (est. 45 in all) compute-sanitizer memcheck, racecheck,
#                     synccheck on a few small conformance tests (skipped where the
#                     runtime does not support it: gVisor)
#   decode-check      20 s   (est. 3)   one query over 1024 cached keys, 12 heads of 64, batch
#                     1 and 16, BF16 and FP32: the split-KV decode kernels vs the row-tiled
#                     forward (ANDREA_CUDA_DECODE=off), 7 x 20 calls of 0.01-0.1 ms each,
#                     plus uploads of 2 x 50 MB of K/V per precision
#   train-check       75 s   (est. 25)  ANDREA-120M, 16 x 1024, 2 steps x FP32/TF32/BF16
#                     + 1 repeated step: 9.9 TFLOP a step at an estimated 15-30 TFLOP/s,
#                     0.35-0.7 s each, plus 4 model initialisations of 92M parameters
#   bench-train-tf32, bench-train-fp32  45 s each (est. 15 each) as bench-train-bf16
#   bench-profile     45 s   (est. 15)  the TF32 step of bench-train on Timed: the per-op table
#   cpu-vs-gpu        45 s   (est. 15)  a tiny model trained by `andrea demo` on the CPU:
#                     eval loss on the CPU and on the GPU (FP32), and the argmax of both
#                     at each position of the same token sequence, teacher-forced
#                     (`gpu_check agree`); on the emulator a smaller demo, 120 s
#   nccl-one-rank     90 s   (est. 10)  20 steps of the tiny model with the gradients
#                     through NCCL on a world of one, against the same without (bit for
#                     bit); skipped when no NCCL library is found
#   bench-decode      25 s   (est. 10)  120M, batch 1, KV cache
#   bench-decode-off  25 s   (est. 10)  the same with ANDREA_CUDA_DECODE=off (no split-KV attention)
#   peer-train-tf32   50 s   (est. 20)  as peer-train-bf16, float32 with TF32 matmuls
#   largest-batch     45 s   (est. 30)  120M training at 32, 64, 128 x 1024 until one fails
#   peer-train-compile 90 s  (est. 70)  torch.compile'd bf16 step (time-boxed: a timeout is
#                     a note, not a failure)
#   ops-bench         90 s   (est. 85)  criterion: the ops bench's CUDA columns (with the
#                     attention_gpu group: 8 functions at 16 x 1024, ~3 s each; time-boxed)
# Exit status: 0 when every phase that ran passed.
set -uo pipefail
cd "$(dirname "$0")"
HERE=$PWD
# The binaries read the kernels' machine code from here (one copy for all of them).
[ -d "$HERE/kernels" ] && export ANDREA_CUDA_KERNEL_DIR="$HERE/kernels"

BUDGET=420
MODE=gpu
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) BUDGET=$2; shift 2 ;;
        --emulator) MODE=emulator; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument \`$1\` (see ./run.sh --help)"; exit 2 ;;
    esac
done

if [ -f "$HERE/DEV-BUILD" ]; then
    # `cargo xtask gpu-bundle --dev`: fine for the emulator dry run, wrong for figures.
    echo "run.sh: WARNING: $(cat "$HERE/DEV-BUILD")" >&2
    [ "$MODE" = gpu ] && echo "run.sh: rebuild with \`cargo xtask gpu-bundle\` before measuring a GPU" >&2
fi

RESULTS=${OUT:-$HERE/results}
WORK=$HERE/work
LOGS=$WORK/logs
rm -rf "$WORK"
mkdir -p "$RESULTS" "$LOGS" "$WORK/criterion" "$WORK/cuda-cache"
ROWS=$RESULTS/rows.jsonl
: >"$ROWS"
export ANDREA_REQUIRE_DEVICE=1
export RUST_BACKTRACE=1
export CUDA_CACHE_PATH=$WORK/cuda-cache
export ANDREA_BIN=$HERE/andrea
export CRITERION_HOME=$WORK/criterion
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
START=$(date +%s)
STATUS=0
# Seconds kept for the summary after the last phase.
RESERVE=8

if [ "$MODE" = emulator ]; then
    CFG_BIG=configs/tiny.toml
    GEMM_ARGS=(--tokens 64 --d-model 64 --vocab 192 --reps 1)
    ATT_ARGS=(--batch 1 --seq 40 --heads 2 --head-dim 32 --reps 1)
    DEC_ARGS=(--batch 2 --keys 70 --heads 2 --head-dim 32 --reps 1 --inner 1)
    TRAIN_ARGS=(--config configs/tiny.toml --batch 2 --seq 32 --steps 2)
    BENCH_SEQ=32
    BENCH_SHAPE=(--batch-size 2 --seq-len 32 --steps 1 --warmup 0)
    LARGEST="1 2"  # the emulator runs a tiny step at 4 x 32 in ~9 s (mma kernels lane by lane)
    DECODE_ARGS=(--batch-size 1 --seq-len 32 --prompt-len 8 --steps 4 --warmup 1)
    PEER_SHAPE=(--batch 2 --seq 32 --steps 2 --warmup 1)
    # cpu-vs-gpu: the emulated eval of the 300 KB demo's 14 windows took 55 s and 48
    # greedy tokens 15 s on a Zen 3 host (2x the Zen 5 one), past the phase's 45 s.
    CVG_CORPUS=100000 CVG_TOKENS=16 CVG_CAP=120
else
    CFG_BIG=configs/andrea-120m.toml
    GEMM_ARGS=(--tokens 16384 --reps 10)
    ATT_ARGS=(--batch 16 --seq 1024 --heads 12 --head-dim 64 --reps 5)
    DEC_ARGS=(--batch 16 --keys 1024 --heads 12 --head-dim 64 --reps 5 --inner 20)
    TRAIN_ARGS=(--config configs/andrea-120m.toml --batch 16 --seq 1024 --steps 2)
    BENCH_SEQ=1024
    CVG_CORPUS=300000 CVG_TOKENS=48 CVG_CAP=45
    BENCH_SHAPE=(--batch-size 16 --seq-len 1024 --steps 5 --warmup 2)
    LARGEST="32 64 128"
    DECODE_ARGS=(--batch-size 1 --seq-len 256 --steps 64)
    PEER_SHAPE=(--batch 16 --seq 1024)
fi

elapsed() { echo $(( $(date +%s) - START )); }

# JSON string escaping for the few free-text fields.
jstr() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\n\r' | cut -c1-300; }

phase_row() { # NAME STATUS RC SECS NOTE
    printf '{"row":"phase","name":"%s","status":"%s","rc":%s,"seconds":%s,"note":"%s","log":"logs/%s.log","mode":"%s"}\n' \
        "$1" "$2" "$3" "$4" "$(jstr "$5")" "$1" "$MODE" >>"$ROWS"
}

save() {
    tar czf "$RESULTS/logs.tar.gz.tmp" -C "$WORK" logs criterion 2>/dev/null &&
        mv "$RESULTS/logs.tar.gz.tmp" "$RESULTS/logs.tar.gz"
    "$PY" "$HERE/summary.py" "$ROWS" >"$RESULTS/summary.txt.tmp" 2>&1 &&
        mv "$RESULTS/summary.txt.tmp" "$RESULTS/summary.txt"
}

# phase NAME CAP MIN [--soft] -- COMMAND...: runs COMMAND under timeout, its output in
# logs/NAME.log, its JSON lines into rows.jsonl. --soft: a timeout is a note, not a failure.
phase() {
    local name=$1 cap=$2 min=$3 soft=0
    shift 3
    if [ "$1" = --soft ]; then soft=1; shift; fi
    [ "$1" = -- ] && shift
    local log=$LOGS/$name.log left t0 rc secs status note=""
    left=$(( BUDGET - $(elapsed) - RESERVE ))
    if [ "$left" -lt "$min" ]; then
        echo "skipped: ${left}s of the budget left, the phase needs ${min}s" >"$log"
        phase_row "$name" skipped 0 0 "budget: ${left}s left, needs ${min}s"
        save
        return 0
    fi
    local limit=$(( cap < left ? cap : left ))
    echo "== $name (limit ${limit}s, $(elapsed)s into the run)"
    t0=$(date +%s)
    # bash -c so that a phase can be one of the functions below (exported); timeout
    # signals the whole process group, so nothing a phase started outlives it.
    timeout --kill-after=5 "$limit" bash -c '"$@"' _ "$@" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    grep '^{' "$log" | sed "s/^{/{\"run_phase\":\"$name\",/" >>"$ROWS"
    if [ "$rc" -eq 0 ]; then
        status=ok
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        note="timed out after ${limit}s"
        if [ "$soft" = 1 ]; then status=timeout; else status=FAIL; STATUS=1; fi
    elif [ "$rc" -eq 77 ]; then
        status=skipped
        note=$(grep -m1 '^SKIP' "$log" | cut -c1-200)
    else
        status=FAIL
        STATUS=1
        note="exit $rc: $(grep -m1 -E 'panicked|FAILED|error|Error' "$log" | cut -c1-200)"
    fi
    phase_row "$name" "$status" "$rc" "$secs" "$note"
    save
}

# A skip from inside a phase: print the reason, exit 77.
skip() { echo "SKIP: $*"; exit 77; }

# ---- the phases, as functions (each runs in a child bash, see `phase`) ---------------------

device() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
    else
        echo "nvidia-smi not found (emulator?)"
    fi
    uname -a
    ./gpu_check loads
}

# PyTorch on the same GPU (on the emulator: on the CPU, at the tiny shapes).
# ANDREA_REQUIRE_PEERS=1 (.ci/run) makes a python3 without torch a failure, not a skip.
peer() {
    if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
        [ "${ANDREA_REQUIRE_PEERS:-0}" = 1 ] &&
            { echo "error: ANDREA_REQUIRE_PEERS=1 and $PY has no torch + transformers"; exit 1; }
        skip "$PY has no torch + transformers: no peer figures"
    fi
    if [ "$MODE" = emulator ]; then export CUDA_VISIBLE_DEVICES=""; fi
    "$PY" peers/gpu_peers.py "$@"
}

SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
conformance=$(ls bin/test-conformance* 2>/dev/null | head -1)
sanitize() {
    local tool=$1
    [ -n "$SANITIZER" ] || skip "compute-sanitizer not found"
    [ -n "$conformance" ] || skip "no conformance test binary"
    # gVisor: "Device not supported"; the probe runs one small test.
    "$SANITIZER" --tool memcheck --error-exitcode 1 "$conformance" --exact cuda_device_present \
        >"$WORK/sanitizer-probe.log" 2>&1 ||
        skip "compute-sanitizer does not run here: $(grep -m1 -iE 'not supported|error' "$WORK/sanitizer-probe.log")"
    "$SANITIZER" --tool "$tool" --error-exitcode 1 "$conformance" --test-threads=1 \
        matmul layernorm softmax attention_forward attention_backward embedding_backward sum_squares ||
        return 1
    # The tensor-core attention (cp.async double buffering: racecheck and synccheck see
    # what the emulator cannot), on the small shapes of tests/cpu_vs_cuda.rs.
    local cvc
    cvc=$(ls bin/test-cpu_vs_cuda* 2>/dev/null | head -1)
    [ -z "$cvc" ] || "$SANITIZER" --tool "$tool" --error-exitcode 1 "$cvc" --test-threads=1 attention_mma
}

# CPU and GPU on the same tiny checkpoint: the eval loss, and what generation would pick.
# Generated text is not compared: where the two best tokens' logits are nearly tied, a
# correct GPU may pick the other one, and the texts part from there on.
cpu_vs_gpu() {
    local d=$WORK/demo
    ./andrea demo --out "$d" --corpus-bytes "$CVG_CORPUS" --merges 256 --steps 30 --batch-size 4 \
        --seq-len 64 >"$WORK/demo.log" 2>&1 || { cat "$WORK/demo.log"; return 1; }
    local ck=$d/run/latest eval=(eval --data "$d/data" --batch-size 4 --seq-len 64 --json)
    ./andrea "${eval[@]}" --checkpoint "$ck" >"$WORK/eval-cpu.json" || return 1
    ./andrea --backend cuda --precision fp32 "${eval[@]}" --checkpoint "$ck" >"$WORK/eval-gpu.json" || return 1
    # Both in FP32: the whole-model test (model_vs_cpu.rs) holds the logits to ~1e-5
    # relative; a mean loss within 1e-4 relative leaves room for the loss's own sums.
    "$PY" - "$WORK" <<'PY' || return 1
import json, sys
w = sys.argv[1]
cpu, gpu = (json.load(open(f"{w}/eval-{x}.json")) for x in ("cpu", "gpu"))
rel = abs(gpu["loss"] - cpu["loss"]) / abs(cpu["loss"])
print(json.dumps({"phase": "cpu_vs_gpu", "check": "eval loss, fp32", "cpu": cpu["loss"],
                  "gpu": gpu["loss"], "rel_diff": rel, "bound": 1e-4, "pass": rel <= 1e-4}))
sys.exit(0 if rel <= 1e-4 else 1)
PY
    # Teacher-forced: both backends decode the same validation tokens through the KV
    # cache, and their argmax must agree wherever the CPU's top two are further apart
    # than the logits' error bound (gpu_check agree says how it is derived).
    local val
    val=$(ls "$d"/data/*_val_000000.bin 2>/dev/null | head -1)
    [ -n "$val" ] || { echo "error: no validation shard in $d/data"; return 1; }
    ./gpu_check agree --checkpoint "$ck" --data "$val" --tokens "$CVG_TOKENS"
}

# NCCL on one rank: the only multi-rank path one GPU can check. `ANDREA_NCCL=on` runs the
# gradients through NCCL (ncclCommInitRank on a world of one, ncclAllReduce in place on
# the backend's stream, no launcher) and must train bit for bit what the plain step
# trains. NCCL comes from ANDREA_NCCL_LIB, else the loader, else python3's
# nvidia-nccl-cu13; on the emulator, the stand-in `cargo xtask cuda-emu` builds
# (target/cuda-emu/nccl). Where andrea finds no NCCL library the phase is skipped, with
# the places andrea looked.
nccl_one_rank() {
    local d=$WORK/demo
    [ -d "$d/data" ] || skip "no demo data (the cpu-vs-gpu phase makes it)"
    if [ -z "${ANDREA_NCCL_LIB:-}" ] && [ "$MODE" = emulator ]; then
        local p
        for p in ${LD_LIBRARY_PATH//:/ }; do
            [ -f "$p/../nccl/libnccl.so.2" ] && ANDREA_NCCL_LIB=$p/../nccl/libnccl.so.2
        done
    elif [ -z "${ANDREA_NCCL_LIB:-}" ]; then
        ANDREA_NCCL_LIB=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
    fi
    [ -n "${ANDREA_NCCL_LIB:-}" ] && export ANDREA_NCCL_LIB
    local steps=20 shape=(--batch-size 4 --seq-len 64)
    [ "$MODE" = emulator ] && steps=2 shape=(--batch-size 1 --seq-len 16)
    local run=(--backend cuda --precision fp32 train --config configs/tiny.toml --data "$d/data"
        --tokenizer "$d/tokenizer.json" "${shape[@]}" --steps "$steps" --warmup-steps 1 --grad-accum 2)
    local t0 t1
    t0=$(date +%s%N)
    if ! ANDREA_NCCL=on ./andrea "${run[@]}" --out "$WORK/nccl-on" >"$WORK/nccl-on.log" 2>&1; then
        cat "$WORK/nccl-on.log"
        # andrea's own search found nothing: nothing to check on this machine.
        grep -q 'could not be loaded; tried' "$WORK/nccl-on.log" &&
            skip "no NCCL library found: $(grep -m1 -o 'tried: .*' "$WORK/nccl-on.log" | cut -c1-160)"
        return 1
    fi
    t1=$(date +%s%N)
    cat "$WORK/nccl-on.log"
    ANDREA_NCCL=off ./andrea "${run[@]}" --out "$WORK/nccl-off" >"$WORK/nccl-off.log" 2>&1 ||
        { cat "$WORK/nccl-off.log"; return 1; }
    local used same=false
    used=$(grep -m1 -o 'gradients: NCCL [^(]*([^)]*)' "$WORK/nccl-on.log" | head -1)
    cmp -s "$WORK/nccl-off/latest/model.safetensors" "$WORK/nccl-on/latest/model.safetensors" &&
        cmp -s "$WORK/nccl-off/latest/optimizer.safetensors" "$WORK/nccl-on/latest/optimizer.safetensors" &&
        same=true
    printf '{"phase":"nccl_one_rank","check":"%s steps through NCCL vs without, bit for bit","nccl":"%s","run_s":%s,"pass":%s}\n' \
        "$steps" "$(jstr "$used")" "$(( (t1 - t0) / 1000000 ))e-3" "$same"
    [ "$same" = true ] && [ -n "$used" ]
}

# The largest batch that fits.
largest() {
    local fit=none b
    for b in $LARGEST; do
        if ./andrea --backend cuda bench train --config "$CFG_BIG" --batch-size "$b" \
            --seq-len "$BENCH_SEQ" --steps 1 --warmup 1 --json >"$WORK/largest-$b.log" 2>&1; then
            sed "s/^{/{\"largest_probe\":$b,/" "$WORK/largest-$b.log" | grep '^{'
            fit=$b
        else
            echo "batch $b does not fit or failed: $(grep -m1 -iE 'error|memory' "$WORK/largest-$b.log")"
            break
        fi
    done
    printf '{"phase":"largest_batch","largest_fitting":"%s","tried":"%s"}\n' "$fit" "$LARGEST"
}

# What the phase functions read (they run in a child bash, see `phase`).
export HERE WORK MODE PY CFG_BIG BENCH_SEQ LARGEST CVG_CORPUS CVG_TOKENS SANITIZER conformance
export -f skip jstr device peer sanitize cpu_vs_gpu nccl_one_rank largest

bench_train() { # PRECISION
    phase "bench-train-$1" 45 15 -- ./andrea --backend cuda --precision "$1" bench train \
        --config "$CFG_BIG" "${BENCH_SHAPE[@]}" --json
}
peer_train() { # MODE
    phase "peer-train-$1" 50 15 -- peer train --config "$CFG_BIG" "${PEER_SHAPE[@]}" --mode "$1"
}

# ---- what decides the design ------------------------------------------------------------------
phase device 10 5 -- device
phase gemm-check 75 20 -- ./gpu_check gemm "${GEMM_ARGS[@]}"
phase attention-check 60 20 -- ./gpu_check attention "${ATT_ARGS[@]}"
bench_train bf16
phase peer-gemm 40 10 -- peer gemm "${GEMM_ARGS[@]}"
phase peer-attention 30 10 -- peer attention "${ATT_ARGS[@]}"
peer_train bf16

# ---- correctness: the test binaries, the sanitizers, production shapes --------------------------
shopt -s nullglob
for b in bin/*; do
    name=$(basename "$b")
    name=test-${name#test-}
    if [ "$MODE" = emulator ]; then
        # One test per binary: that each starts on the "device"; CI runs them all.
        first=$("$b" --list 2>/dev/null | grep ': test$' | head -1 | sed 's/: test$//')
        phase "$name" 60 10 -- "$b" --test-threads=1 --exact "$first"
    else
        phase "$name" 60 10 -- "$b" --test-threads=1
    fi
done
for tool in memcheck racecheck synccheck; do
    if [ "$MODE" = emulator ]; then
        phase "sanitizer-$tool" 30 5 -- skip "emulator: compute-sanitizer needs a GPU"
    else
        phase "sanitizer-$tool" 30 15 -- sanitize "$tool"
    fi
done
phase decode-check 20 5 -- ./gpu_check decode "${DEC_ARGS[@]}"
phase train-check 75 20 -- ./gpu_check train "${TRAIN_ARGS[@]}"

# ---- the rest: the other precisions, where a step's time goes, CPU vs GPU, NCCL, decoding --------
bench_train tf32
bench_train fp32
# Where that step's time goes, op by op (each op between two synchronisations, so the
# step is slower than above; the table is per step).
phase bench-profile 45 15 -- ./andrea --backend cuda bench train --config "$CFG_BIG" \
    "${BENCH_SHAPE[@]}" --profile
phase cpu-vs-gpu "$CVG_CAP" 15 -- cpu_vs_gpu
phase nccl-one-rank 90 10 -- nccl_one_rank
phase bench-decode 25 8 -- ./andrea --backend cuda bench decode --config "$CFG_BIG" "${DECODE_ARGS[@]}" --json
# The same with the split-KV decode attention off (the row-tiled forward), for the comparison.
phase bench-decode-off 25 8 -- env ANDREA_CUDA_DECODE=off ./andrea --backend cuda bench decode --config "$CFG_BIG" "${DECODE_ARGS[@]}" --json
peer_train tf32
phase largest-batch 45 20 -- largest

# ---- time-boxed extras ----------------------------------------------------------------------------
if [ "$MODE" = emulator ]; then
    # torch.compile on the CPU (inductor through the C++ compiler) takes longer than the
    # whole dry run's other peer phases, and the eager runs above cover the script.
    phase peer-train-compile 10 1 -- skip "emulator: torch.compile's CPU build of the model takes minutes"
    phase ops-bench 10 1 -- skip "emulator: criterion timings need a GPU"
else
    phase peer-train-compile 90 40 --soft -- peer train --config "$CFG_BIG" "${PEER_SHAPE[@]}" --mode bf16 --compile
    phase ops-bench 90 30 --soft -- bench/ops --bench cuda-
fi

save
echo
cat "$RESULTS/summary.txt"
echo "results: $RESULTS (rows.jsonl, summary.txt, logs.tar.gz); $(elapsed)s of ${BUDGET}s"
exit "$STATUS"
