#!/usr/bin/env python3
"""PyTorch's side of the GPU bundle's table (`run.sh`, benches/README.md "GPU"): what a
user would run instead of andrea, measured on the same GPU in the same run. One JSON
object per line, `"implementation": "pytorch"`:

    gpu_peers.py gemm      --tokens 16384 [--d-model 768 --vocab 8512 --reps 10]
    gpu_peers.py attention --batch 16 --seq 1024 --heads 12 --head-dim 64 [--reps 5]
    gpu_peers.py train     --config configs/andrea-120m.toml --batch 16 --seq 1024
                           --mode bf16|tf32 [--compile] [--steps 5 --warmup 3]

* gemm: `torch.matmul` (cuBLAS) on the 11 products of an ANDREA-120M step, the same
  shapes and transposes as `gpu_check gemm`, in fp32 (TF32 off), tf32 and bf16.
* attention: `scaled_dot_product_attention(is_causal=True)` forward and forward +
  backward at [B, H, T, D], in bf16 (the flash kernel) and fp32.
* train: transformers' GPT2LMHeadModel configured as the config file (as
  train_step.py builds it, with `gelu_pytorch_tanh`, the fused form of the same GELU,
  and SDPA attention), AdamW (fused on a GPU) with the config's hyper-parameters and
  gradient clipping; `bf16` runs forward and loss under `torch.autocast(bfloat16)`,
  `tf32` in float32 with TF32 matmuls; `--compile` wraps the model in `torch.compile`
  (the bundle time-boxes it).

Runs on a CPU too, for the bundle's dry run (tiny shapes; bf16 and TF32 then only say
what they would be). Needs torch and transformers.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import adamw, build, flops_per_token, load_config  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps, warmup=2):
    """Median seconds of `reps` calls after `warmup`, each synchronised."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def emit(**row):
    row = {"implementation": "pytorch", "device": device_name(), **row}
    print(json.dumps(row), flush=True)


def device_name():
    return torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu"


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def gemms(bt, c, v):
    """(name, m, k, n, a transposed, b transposed), as gpu_check.rs."""
    return [
        ("fwd_qkv", bt, c, 3 * c, False, False),
        ("fwd_attn_proj", bt, c, c, False, False),
        ("fwd_fc", bt, c, 4 * c, False, False),
        ("fwd_fc_proj", bt, 4 * c, c, False, False),
        ("fwd_lm_head", bt, c, v, False, True),
        ("bwd_dx_qkv", bt, 3 * c, c, False, True),
        ("bwd_dw_qkv", c, bt, 3 * c, True, False),
        ("bwd_dx_fc_proj", bt, c, 4 * c, False, True),
        ("bwd_dw_fc_proj", 4 * c, bt, c, True, False),
        ("bwd_dx_lm_head", bt, v, c, False, False),
        ("bwd_dwte_lm_head", v, bt, c, True, False),
    ]


def operand(rows, cols, transposed, dtype):
    """A [rows, cols] operand stored as andrea stores it (transposed: [cols, rows])."""
    if transposed:
        return torch.rand(cols, rows, device=DEV, dtype=dtype).mul_(2).sub_(1).t()
    return torch.rand(rows, cols, device=DEV, dtype=dtype).mul_(2).sub_(1)


def run_gemm(a):
    for precision in ("fp32", "tf32", "bf16"):
        set_tf32(precision == "tf32")
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for name, m, k, n, ta, tb in gemms(a.tokens, a.d_model, a.vocab):
            x, w = operand(m, k, ta, dtype), operand(k, n, tb, dtype)
            out = torch.empty(m, n, device=DEV, dtype=dtype)
            secs = timed(lambda: torch.matmul(x, w, out=out), a.reps)
            emit(phase="gemm", name=name, m=m, k=k, n=n, precision=precision,
                 median_ms=secs * 1e3, tflop_per_s=2 * m * k * n / secs / 1e12)
            del x, w, out
    set_tf32(False)


def run_attention(a):
    b, t, h, d = a.batch, a.seq, a.heads, a.head_dim
    flops = 4 * b * h * t * t * d  # full T×T, as gpu_check counts the kernels' work
    # bf16: FlashAttention-2 / cuDNN kernels; fp32: FP32 throughout; tf32: FP32 tensors
    # with TF32 matmuls allowed (what the math and memory-efficient backends may use).
    for precision, dtype in (("bf16", torch.bfloat16), ("tf32", torch.float32),
                             ("fp32", torch.float32)):
        set_tf32(precision == "tf32")
        q, k, v = (torch.randn(b, h, t, d, device=DEV, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn(b, h, t, d, device=DEV, dtype=dtype)

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout)

        f = timed(fwd, a.reps)
        fb = timed(fwd_bwd, a.reps)
        name = f"{b}x{t}x{h}x{d}"
        emit(phase="attention", name=f"forward_{name}", precision=precision,
             median_ms=f * 1e3, tflop_per_s=flops / f / 1e12)
        # The backward alone: forward + backward minus the forward.
        bwd = max(fb - f, 1e-9)
        emit(phase="attention", name=f"backward_{name}", precision=precision,
             median_ms=bwd * 1e3, tflop_per_s=2.5 * flops / bwd / 1e12,
             forward_backward_ms=fb * 1e3)
    set_tf32(False)


def run_train(a):
    model_cfg, opt_cfg = load_config(a.config)
    # peer "fast": `gelu_pytorch_tanh`, the fused form of the same GELU (train_step.py).
    model = build(model_cfg, seed=1, peer="fast")
    model.config._attn_implementation = "sdpa"
    model.to(DEV)
    set_tf32(a.mode == "tf32")
    opt = adamw(model, opt_cfg, fused=(DEV == "cuda"))
    step_model = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model_cfg["vocab_size"], (a.batch, a.seq + 1), generator=g).to(DEV)
    x, y = ids[:, :-1], ids[:, 1:]
    autocast = torch.autocast(DEV, dtype=torch.bfloat16, enabled=(a.mode == "bf16"))
    last = {}

    def step():
        with autocast:
            logits = step_model(x).logits
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt_cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        last["loss"] = loss.detach()

    t0 = time.perf_counter()
    secs = timed(step, a.steps, warmup=a.warmup)
    tokens = a.batch * a.seq
    tps = tokens / secs
    emit(phase="train", config=model_cfg.get("name", a.config), mode=a.mode,
         compiled=bool(a.compile), batch=a.batch, seq_len=a.seq, steps=a.steps,
         median_s=secs, tokens_per_s=tps,
         gflop_per_s=flops_per_token(model_cfg, a.seq) * tps / 1e9,
         loss=float(last["loss"]), wall_s=time.perf_counter() - t0,
         torch=torch.__version__)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--tokens", type=int, default=16384)
    g.add_argument("--d-model", type=int, default=768)
    g.add_argument("--vocab", type=int, default=8512)
    g.add_argument("--reps", type=int, default=10)
    at = sub.add_parser("attention")
    at.add_argument("--batch", type=int, default=16)
    at.add_argument("--seq", type=int, default=1024)
    at.add_argument("--heads", type=int, default=12)
    at.add_argument("--head-dim", type=int, default=64)
    at.add_argument("--reps", type=int, default=5)
    t = sub.add_parser("train")
    t.add_argument("--config", default="configs/andrea-120m.toml")
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--mode", choices=["bf16", "tf32"], default="bf16")
    t.add_argument("--compile", action="store_true")
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    {"gemm": run_gemm, "attention": run_attention, "train": run_train}[a.cmd](a)


if __name__ == "__main__":
    main()
