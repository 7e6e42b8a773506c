#!/usr/bin/env python3
"""Checks that transformers loads a model directory andrea wrote and computes the same
logits (written by `cargo run -p andrea-model --example export_check -- DIR`).

    python crates/andrea-model/scripts/check_transformers_load.py DIR
"""

import json
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    path = sys.argv[1]
    model = GPT2LMHeadModel.from_pretrained(path).eval()
    want = json.load(open(f"{path}/andrea_logits.json"))
    tokens = torch.tensor([want["tokens"]])
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0]
    andrea = torch.tensor(want["logits"]).reshape(logits.shape)
    diff = (logits - andrea).abs().max().item()
    scale = logits.abs().max().item()
    print(f"max |transformers - andrea| = {diff:.3e} (logits up to {scale:.3f})")
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head not tied"
    assert diff <= 1e-4 * max(1.0, scale), "logits differ"
    print("OK: transformers loads the andrea checkpoint and computes the same logits")


if __name__ == "__main__":
    main()
