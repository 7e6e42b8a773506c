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
"""

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


def build(model_cfg, seed):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=model_cfg["vocab_size"],
        n_positions=model_cfg["context_length"],
        n_embd=model_cfg["d_model"],
        n_layer=model_cfg["n_layer"],
        n_head=model_cfg["n_head"],
        n_inner=model_cfg["mlp_dim"],
        activation_function="gelu_new",
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


def train(args, model_cfg, opt_cfg):
    model = build(model_cfg, args.seed)
    model.train()
    opt = adamw(model, opt_cfg)
    g = torch.Generator().manual_seed(args.seed)
    stream = torch.randint(0, model_cfg["vocab_size"],
                           (args.batch_size * args.seq_len + 1,), generator=g)
    x = stream[:-1].view(args.batch_size, args.seq_len)
    y = stream[1:].view(args.batch_size, args.seq_len)
    clip = opt_cfg["grad_clip"]
    total, fwd, bwd, optim = [], [], [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        logits = model(input_ids=x).logits
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
    model = build(model_cfg, args.seed)
    model.eval()
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, model_cfg["vocab_size"], (args.batch_size, args.prompt_len),
                           generator=g)

    def prefill():
        out = model(input_ids=prompt, use_cache=True)
        return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True), args.prompt_len

    past, nxt, length = prefill()
    times = []
    for i in range(args.warmup + args.steps):
        if length == args.seq_len:
            past, nxt, length = prefill()
        t0 = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        nxt = nxt.clone()  # materialise the pick inside the timed region
        t1 = time.perf_counter()
        length += 1
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
    args = ap.parse_args()
    # transformers 5.24 announces `cache=` as the new name of `past_key_values=`; the
    # old name still works and is the one older versions know.
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
    hf_logging.set_verbosity_error()
    args.steps = args.steps if args.steps is not None else (64 if args.decode else 5)
    args.warmup = args.warmup if args.warmup is not None else (8 if args.decode else 2)
    torch.set_num_threads(args.threads)
    model_cfg, opt_cfg = load_config(args.config)
    for _ in range(args.repeat):
        if args.decode:
            decode(args, model_cfg)
        else:
            train(args, model_cfg, opt_cfg)


if __name__ == "__main__":
    main()
