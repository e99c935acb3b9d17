#!/usr/bin/env python3
"""Writes the demo LM's full `Qwen2ForCausalLM` checkpoint from its compact form (see
scripts/demo/pretrain_lm.py): every tensor as stored, and `model.embed_tokens.weight` with all of
Qwen's 151,936 rows, the trained ones at their ids (`token_ids`) and zeros elsewhere.

Usage: python3 scripts/demo/expand_lm.py COMPACT_DIR OUT_DIR   (numpy + safetensors: .deps/venv)
COMPACT_DIR holds config.json (the full model's) and compact.safetensors; OUT_DIR gets
config.json and model.safetensors.
"""
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

EMBED = "model.embed_tokens.weight"


def expand(source, out):
    """Writes OUT/config.json and OUT/model.safetensors from SOURCE's compact form."""
    with open(os.path.join(source, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    tensors = load_file(os.path.join(source, "compact.safetensors"))
    ids = tensors.pop("token_ids")
    rows = tensors[EMBED]
    if ids.ndim != 1 or len(ids) != len(rows) or ids.min() < 0 or ids.max() >= vocab:
        raise SystemExit(f"{source}: token_ids do not index {vocab} rows of {EMBED} {rows.shape}")
    full = np.zeros((vocab, rows.shape[1]), dtype=rows.dtype)
    full[ids] = rows
    tensors[EMBED] = full
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(source, "config.json"), os.path.join(out, "config.json"))
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    expand(*sys.argv[1:])


if __name__ == "__main__":
    main()
