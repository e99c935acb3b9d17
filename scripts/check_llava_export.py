#!/usr/bin/env python3
"""Loads a `tessera export --format llava-hf` directory with transformers and checks it is whole.

Usage: .deps/venv/bin/python scripts/check_llava_export.py EXPORT_DIR [TENSOR_NAME ...]

Fails (exit 1, naming the keys) when transformers reports missing, unexpected or mismatched
weights; then prints one JSON line: the model class, its parameter count, and for each
TENSOR_NAME (a transformers state-dict key) its sum, so a caller can compare values with the
checkpoint it exported. tests/generate.rs runs it on a full fine-tune's export.
"""
import json
import sys

import torch
from transformers import LlavaForConditionalGeneration


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    model, info = LlavaForConditionalGeneration.from_pretrained(
        sys.argv[1], torch_dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"{sys.argv[1]}: transformers loads it with {problems}", file=sys.stderr)
        sys.exit(1)
    state = model.state_dict()
    sums = {}
    for name in sys.argv[2:]:
        if name not in state:
            print(f"{sys.argv[1]}: no tensor {name} (has {sorted(state)[:8]}...)", file=sys.stderr)
            sys.exit(1)
        sums[name] = float(state[name].double().sum())
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"class": type(model).__name__, "parameters": params, "sums": sums}))


if __name__ == "__main__":
    main()
