#!/usr/bin/env python3
"""Reference fixtures from Hugging Face transformers for andrea-model's tests.

Builds a small random GPT2LMHeadModel with ANDREA-120M's vocabulary (8449), saves it with
`save_pretrained` (what `Model::load` must read), then computes in float64 for fixed token
batches: the logits, the loss and every parameter's gradient, and the losses, gradient
norms and parameters of three AdamW steps with non-default lr, betas, eps, weight decay
and gradient clipping. The test `tests/hf_fixtures.rs` compares andrea against them.

Regenerate (from the repository root; CPU only, a few seconds):

    pip install torch transformers safetensors
    python crates/andrea-model/scripts/make_fixtures.py

Written: crates/andrea-model/fixtures/hf_tiny/{config.json,model.safetensors} and
crates/andrea-model/fixtures/hf_tiny_expected.safetensors (about 2 MB in all).
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
VOCAB, CONTEXT, D_MODEL, LAYERS, HEADS = 8449, 16, 16, 2, 2
BATCH, SEQ = 2, 8
STEPS = 3
# Every AdamW hyper-parameter differs from torch's defaults; clipping takes effect.
HYPER = {"lr": 3e-3, "beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.05, "grad_clip": 0.5}
IGNORE = -100


def main():
    torch.manual_seed(20240520)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=D_MODEL,
        n_layer=LAYERS,
        n_head=HEADS,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=0.1,  # larger than GPT-2's 0.02: logits far from uniform
        tie_word_embeddings=True,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        # GPT-2 starts biases at 0 and LayerNorm at (1, 0): move them, so every
        # gradient path is exercised.
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(OUT, "hf_tiny"), safe_serialization=True)

    # The reference computation runs in float64 from the same (float32) weights.
    model = model.double().eval()
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(STEPS)]
    targets = [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(STEPS)]
    targets[0][0, 3] = IGNORE  # an ignored position: the mean is over the others

    def forward(i):
        logits = model(input_ids=tokens[i]).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[i].reshape(-1), ignore_index=IGNORE)
        return logits, loss

    out = {}
    for i in range(STEPS):
        out[f"tokens.{i}"] = tokens[i]
        out[f"targets.{i}"] = targets[i]
    logits, loss = forward(0)
    loss.backward()
    out["logits"] = logits.detach().float()
    out["loss"] = loss.detach().reshape(1)
    for name, p in model.named_parameters():
        out[f"grad.{name}"] = p.grad.detach().float()
    model.zero_grad()

    # andrea's rule: weight decay on 2-D tensors (matmul weights, embeddings) only.
    params = list(model.named_parameters())
    groups = [
        {"params": [p for _, p in params if p.dim() == 2], "weight_decay": HYPER["weight_decay"]},
        {"params": [p for _, p in params if p.dim() != 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"])
    step_loss, grad_norm = [], []
    for i in range(STEPS):
        opt.zero_grad()
        _, loss = forward(i)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), HYPER["grad_clip"])
        opt.step()
        step_loss.append(loss.item())
        grad_norm.append(norm.item())
    for name, p in model.named_parameters():
        out[f"final.{name}"] = p.detach().float()
    _, loss = forward(0)
    out["final_loss"] = loss.detach().reshape(1)
    out["step_loss"] = torch.tensor(step_loss, dtype=torch.float64)
    out["grad_norm"] = torch.tensor(grad_norm, dtype=torch.float64)

    meta = {k: repr(v) for k, v in HYPER.items()}
    meta["format"] = "pt"
    meta["torch"] = torch.__version__
    import transformers

    meta["transformers"] = transformers.__version__
    path = os.path.join(OUT, "hf_tiny_expected.safetensors")
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}; loss {out['loss'].item():.6f}, grad norms {grad_norm}, step losses {step_loss}")


if __name__ == "__main__":
    main()
