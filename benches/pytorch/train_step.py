#!/usr/bin/env python3
"""PyTorch's side of benches/README.md "Model: training step and decode vs PyTorch".

The same measurements as `cargo run --release -p andrea-model --example bench`, on
transformers' GPT2LMHeadModel built from the same config file, printing the same JSON
shape (one object per line, `tokens_per_s` the median over the timed iterations):

* train_step: forward, mean cross-entropy over every position against next-token
  targets, backward, `clip_grad_norm_`, `torch.optim.AdamW` (the config's lr, betas,
  eps and weight decay, decay on 2-D tensors only, as andrea), float32.
* decode: greedy decoding one token at a time with the KV cache
  (`model(ids, past_key_values=..., use_cache=True)`), after a prompt prefilled untimed;
  when the cache reaches `--seq-len` positions it is dropped and the prompt prefilled
  again, untimed, as andrea's `bench::Decoder` does.

Optional (not needed by the tests). Run from the repository root:

    python benches/pytorch/train_step.py --config configs/andrea-120m.toml \
        --batch-size 4 --seq-len 256 --steps 5
    python benches/pytorch/train_step.py --config configs/andrea-120m.toml \
        --decode --batch-size 1 --seq-len 256 --steps 64

Needs torch and transformers (`pip install torch transformers`).

**Peer configuration** (`--peer`, default `fast`): PyTorch's fastest eager set-up for
this model on a CPU. `fast` builds the model with `activation_function="gelu_pytorch_tanh"`
(the same function as `gelu_new`, the tanh form, in one fused ATen kernel instead of
seven elementwise ones) and steps `torch.optim.AdamW(fused=True)` (one fused kernel over
all parameters; it exists on CPU since torch 2.4). `old` is the set-up of the first
measurements: `gelu_new` and the default AdamW (a loop per parameter on CPU).
`--compile` wraps the model in `torch.compile` (inductor) for the training step or the
decode step; the first `--warmup` iterations then include the compilation, and
`--compile-timeout S` makes the run give up (exit 3, one JSON line with `"error"`)
when the compiled warm-up takes longer than S seconds in total. Whether compiling is
faster is measured by benches/side_by_side.py, not assumed. Threads: `--threads`
(default 2) sets both intra-op and inter-op threads.

**Huge pages:** by default the script sets `THP_MEM_ALLOC_ENABLE=1` before torch loads,
so PyTorch's CPU allocator aligns large tensors to 2 MiB and advises transparent huge
pages, as andrea's CPU backend does for its large buffers (on the build machine, with
THP in `madvise` mode, a read stream runs about a fifth faster on huge pages, and the
decode's weights stream more so). `--no-thp` leaves PyTorch on 4 KiB pages (the set-up
of the measurements before 2026-12-02); the JSON line records which (`"thp"`).
"""

import os
import sys

# Read by c10 once, at the first allocation: it must be set before torch is imported.
if "--no-thp" not in sys.argv:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import argparse
import json
import statistics
import time
import tomllib
import warnings

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

# The defaults of andrea_core's ModelConfig / OptimizerConfig for keys a file may omit.
MODEL_DEFAULTS = {"layer_norm_eps": 1e-5, "init_std": 0.02}
OPTIMIZER_DEFAULTS = {"lr": 6e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                      "weight_decay": 0.1, "grad_clip": 1.0}


def load_config(path):
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    model = {**MODEL_DEFAULTS, **cfg["model"]}
    model.setdefault("mlp_dim", 4 * model["d_model"])
    optimizer = {**OPTIMIZER_DEFAULTS, **cfg.get("optimizer", {})}
    return model, optimizer


def build(model_cfg, seed, peer):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=model_cfg["vocab_size"],
        n_positions=model_cfg["context_length"],
        n_embd=model_cfg["d_model"],
        n_layer=model_cfg["n_layer"],
        n_head=model_cfg["n_head"],
        n_inner=model_cfg["mlp_dim"],
        # Both are the tanh form (DESIGN.md); "gelu_pytorch_tanh" is one fused kernel.
        activation_function="gelu_pytorch_tanh" if peer == "fast" else "gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=model_cfg["layer_norm_eps"],
        initializer_range=model_cfg["init_std"],
        tie_word_embeddings=True,
        bos_token_id=model_cfg.get("eos_token_id"),
        eos_token_id=model_cfg.get("eos_token_id"),
    )
    return GPT2LMHeadModel(config)


def flops_per_token(m, seq):
    """andrea_core's ModelConfig::training_flops_per_token."""
    c, mlp, n_layer, v = m["d_model"], m["mlp_dim"], m["n_layer"], m["vocab_size"]
    weights = n_layer * (4 * c * c + 2 * c * mlp) + c * v
    return 6 * weights + 6 * n_layer * c * (seq + 1)


def spread(samples):
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


def report(args, model_cfg, model, bench, tokens_per_step, times, **extra):
    s = spread(times)
    out = {
        "implementation": "pytorch",
        "bench": bench,
        "config": model_cfg.get("name", "unnamed"),
        "backend": f"torch {torch.__version__} cpu ({torch.get_num_threads()} threads, "
                   f"{torch.backends.cpu.get_cpu_capability()}, "
                   f"attn {model.config._attn_implementation})",
        "peer": args.peer,
        "activation": model.config.activation_function,
        "compile": args.compile,
        "thp": os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
        "compile_warmup_s": getattr(args, "compile_warmup_s", None),
        "batch": args.batch_size,
        "seq_len": args.seq_len,
        **({"prompt_len": args.prompt_len} if bench == "decode" else {}),
        "warmup": args.warmup,
        "steps": args.steps,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / s["median_s"],
        **s,
        **extra,
    }
    print(json.dumps(out), flush=True)


def adamw(model, opt_cfg, **kwargs):
    """torch.optim.AdamW with the config's hyper-parameters, decay on 2-D tensors only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt_cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=opt_cfg["lr"], betas=(opt_cfg["beta1"], opt_cfg["beta2"]), eps=opt_cfg["eps"],
        **kwargs,
    )


class CompileTimeout(Exception):
    pass


def check_compile_time(args, i, started):
    """After warm-up iteration `i` of a `--compile` run: give up past the time box."""
    if args.compile and i < args.warmup:
        spent = time.perf_counter() - started
        args.compile_warmup_s = spent
        if args.compile_timeout and spent > args.compile_timeout:
            raise CompileTimeout(f"compiled warm-up took {spent:.0f} s, over "
                                 f"--compile-timeout {args.compile_timeout} s")


def train(args, model_cfg, opt_cfg):
    model = build(model_cfg, args.seed, args.peer)
    model.train()
    opt = adamw(model, opt_cfg, **({"fused": True} if args.peer == "fast" else {}))
    forward = torch.compile(model) if args.compile else model
    g = torch.Generator().manual_seed(args.seed)
    stream = torch.randint(0, model_cfg["vocab_size"],
                           (args.batch_size * args.seq_len + 1,), generator=g)
    x = stream[:-1].view(args.batch_size, args.seq_len)
    y = stream[1:].view(args.batch_size, args.seq_len)
    clip = opt_cfg["grad_clip"]
    total, fwd, bwd, optim = [], [], [], []
    started = time.perf_counter()
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        logits = forward(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss_value = loss.item()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        del logits, loss
        check_compile_time(args, i, started)
        if i >= args.warmup:
            total.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optim.append(t3 - t2)
    tokens = args.batch_size * args.seq_len
    med = statistics.median(total)
    report(args, model_cfg, model, "train_step", tokens, total,
           gflop_per_s=flops_per_token(model_cfg, args.seq_len) * tokens / med / 1e9,
           phases={"forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
                   "optimizer_s": statistics.median(optim)},
           loss=loss_value)


@torch.no_grad()
def decode(args, model_cfg):
    model = build(model_cfg, args.seed, args.peer)
    model.eval()
    step = torch.compile(model) if args.compile else model
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, model_cfg["vocab_size"], (args.batch_size, args.prompt_len),
                           generator=g)

    def prefill():
        out = model(input_ids=prompt, use_cache=True)
        return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True), args.prompt_len

    past, nxt, length = prefill()
    times = []
    started = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if length == args.seq_len:
            past, nxt, length = prefill()
        t0 = time.perf_counter()
        out = step(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        nxt = nxt.clone()  # materialise the pick inside the timed region
        t1 = time.perf_counter()
        length += 1
        check_compile_time(args, i, started)
        if i >= args.warmup:
            times.append(t1 - t0)
    report(args, model_cfg, model, "decode", args.batch_size, times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/andrea-120m.toml")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256,
                    help="training: sequence length; decode: KV cache capacity")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed iterations (default 5 steps, 64 decoded tokens)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed iterations first (default 2 steps, 8 tokens)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--peer", choices=["fast", "old"], default="fast",
                    help="fast: gelu_pytorch_tanh + AdamW(fused=True); old: gelu_new + "
                         "the default AdamW")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--no-thp", action="store_true",
                    help="leave PyTorch's tensors on 4 KiB pages (no THP_MEM_ALLOC_ENABLE)")
    ap.add_argument("--compile-timeout", type=float, default=None,
                    help="with --compile: give up (exit 3) when the warm-up takes longer")
    args = ap.parse_args()
    # transformers 5.24 announces `cache=` as the new name of `past_key_values=`; the
    # old name still works and is the one older versions know.
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
    hf_logging.set_verbosity_error()
    args.steps = args.steps if args.steps is not None else (64 if args.decode else 5)
    args.warmup = args.warmup if args.warmup is not None else (8 if args.decode else 2)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(args.threads)
    model_cfg, opt_cfg = load_config(args.config)
    try:
        for _ in range(args.repeat):
            if args.decode:
                decode(args, model_cfg)
            else:
                train(args, model_cfg, opt_cfg)
    except CompileTimeout as e:
        print(json.dumps({"implementation": "pytorch", "peer": args.peer, "compile": True,
                          "config": model_cfg.get("name", "unnamed"),
                          "bench": "decode" if args.decode else "train_step",
                          "error": str(e)}), flush=True)
        raise SystemExit(3)


if __name__ == "__main__":
    main()
