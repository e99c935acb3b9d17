#!/usr/bin/env python3
"""Writes a random Qwen2 LM directory of a chosen width and scale next to a copy of a vision
tower: the sweep behind the tiny preset's init (docs/performance-notes.md, "Stage 1 learning").

Usage: .deps/venv/bin/python scripts/lm_variant.py MODEL_DIR OUT_DIR \
           --hidden 128 --layers 2 --kv-heads 2 --embed-std 0.177 [--qk-gain 1]
MODEL_DIR is an `init-model` output (its vision/ is copied, its lm/config.json is the base).
Matrices are N(0, 1/fan_in) (query and key times --qk-gain), embeddings N(0, embed_std^2),
biases N(0, 0.02^2), norm weights 1 + N(0, 0.02^2).
"""
import argparse, json, os, shutil
import numpy as np
from safetensors.numpy import save_file

p = argparse.ArgumentParser()
p.add_argument("model"), p.add_argument("out")
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=2)
p.add_argument("--embed-std", type=float, required=True)
p.add_argument("--qk-gain", type=float, default=1.0)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

rng = np.random.default_rng(a.seed)
shutil.copytree(os.path.join(a.model, "vision"), os.path.join(a.out, "vision"), dirs_exist_ok=True)
os.makedirs(os.path.join(a.out, "lm"), exist_ok=True)
cfg = json.load(open(os.path.join(a.model, "lm", "config.json")))
H, heads, kv = a.hidden, a.heads, a.kv_heads
head_dim, ff = H // heads, 2 * H
cfg.update(hidden_size=H, intermediate_size=ff, num_hidden_layers=a.layers,
           num_attention_heads=heads, num_key_value_heads=kv)
json.dump(cfg, open(os.path.join(a.out, "lm", "config.json"), "w"), indent=2)

def matrix(rows, cols, gain=1.0):
    return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

def vector(n, offset=0.0):
    return (offset + 0.02 * rng.standard_normal(n)).astype(np.float32)

t = {"model.embed_tokens.weight":
         (rng.standard_normal((cfg["vocab_size"], H)) * a.embed_std).astype(np.float32),
     "model.norm.weight": vector(H, 1.0)}
for layer in range(a.layers):
    pre = f"model.layers.{layer}."
    t[pre + "input_layernorm.weight"] = vector(H, 1.0)
    t[pre + "post_attention_layernorm.weight"] = vector(H, 1.0)
    for name, rows, gain in [("q", heads * head_dim, a.qk_gain), ("k", kv * head_dim, a.qk_gain),
                             ("v", kv * head_dim, 1.0)]:
        t[pre + f"self_attn.{name}_proj.weight"] = matrix(rows, H, gain)
        t[pre + f"self_attn.{name}_proj.bias"] = vector(rows)
    t[pre + "self_attn.o_proj.weight"] = matrix(H, heads * head_dim)
    t[pre + "mlp.gate_proj.weight"] = matrix(ff, H)
    t[pre + "mlp.up_proj.weight"] = matrix(ff, H)
    t[pre + "mlp.down_proj.weight"] = matrix(H, ff)
save_file(t, os.path.join(a.out, "lm", "model.safetensors"), metadata={"format": "pt"})
