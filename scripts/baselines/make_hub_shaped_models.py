#!/usr/bin/env python3
"""Random-weight stand-ins for the Hub checkpoints tessera's benchmarks use, with the configs
and file layout the Hub ships, so that benchmarks run the real shapes without downloading:
  OUT_DIR/siglip:  google/siglip-so400m-patch14-384, a full SiglipModel (text and vision towers),
                   config.json with nested text_config / vision_config (27 layers, 1152 wide,
                   MLP 4304, 16 heads, 384 px, patch 14);
  OUT_DIR/qwen:    Qwen/Qwen2.5-0.5B, Qwen2ForCausalLM (24 layers, 896 wide, 14 heads, 2 KV
                   heads, vocab 151,936, rope_theta 1e6 at the top level, tied embeddings);
and, when named after OUT_DIR:
  qwen3   -> OUT_DIR/qwen3:   Qwen/Qwen3-0.6B-Base, Qwen3ForCausalLM (28 layers, 1024 wide, 16
                              heads of head_dim 128, 8 KV heads, q/k norms, no bias, tied);
  smollm2 -> OUT_DIR/smollm2: HuggingFaceTB/SmolLM2-360M, LlamaForCausalLM (32 layers, 960 wide,
                              15 heads, 5 KV heads, rope_theta 1e5, tied, vocab 49,152);
  qwen3moe -> OUT_DIR/qwen3moe: Qwen/Qwen3-30B-A3B-Base's config with 2 of its 48 layers,
                              Qwen3MoeForCausalLM (128 experts of width 768, top 8 renormalised,
                              hidden 2048, 32 heads / 4 KV of head_dim 128, untied; per-expert
                              keys as the Hub's; 3.7 GB, ~8 GB of RAM while writing).
Weights: transformers' own random initialisation (seed 0), stored as bf16 model.safetensors.
What it measures: nothing; it is the fixture the benchmarks (scripts/bench/cpu_vs_hf.sh,
scripts/device/device_bench.sh, hf_train_step.py) load. About 2.7 GB on disk (1.2 GB more for qwen3,
0.7 GB for smollm2), ~6 GB of RAM while writing, a few minutes on 2 cores.

Run: python scripts/baselines/make_hub_shaped_models.py OUT_DIR [qwen3] [smollm2] [qwen3moe] [--layers N]
  (a Python with torch and transformers, e.g. .deps/hfvenv/bin/python). --layers N gives every
  tower N layers instead (quick tests only: config.json then differs from the Hub's).
"""
import argparse
import copy
import json
import os
import time

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, SiglipConfig,
                          SiglipModel)

# config.json of google/siglip-so400m-patch14-384 (the two vision defaults written out).
SIGLIP_SO400M_384 = {
    "architectures": ["SiglipModel"],
    "initializer_factor": 1.0,
    "model_type": "siglip",
    "text_config": {
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "model_type": "siglip_text_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
    },
    "torch_dtype": "bfloat16",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 384,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-06,
    },
}

# config.json of Qwen/Qwen2.5-0.5B.
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# config.json of Qwen/Qwen3-0.6B-Base.
QWEN3_06B_BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# config.json of HuggingFaceTB/SmolLM2-360M.
SMOLLM2_360M = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 960,
    "initializer_range": 0.02,
    "intermediate_size": 2560,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 15,
    "num_hidden_layers": 32,
    "num_key_value_heads": 5,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 49152,
}

# config.json of Qwen/Qwen3-30B-A3B-Base, its 48 layers cut to 2 (set by --moe-layers): the
# per-layer shapes (128 experts of width 768, top 8, hidden 2048, 32/4 heads of 128) are the
# Hub's, so a step costs what two of its layers cost.
QWEN3_30B_A3B_2L = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151643,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 32768,
    "max_window_layers": 2,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# The optional LMs: name -> (Hub config, config class, model class).
EXTRA_LMS = {
    "qwen3": (QWEN3_06B_BASE, Qwen3Config, Qwen3ForCausalLM),
    "smollm2": (SMOLLM2_360M, LlamaConfig, LlamaForCausalLM),
    "qwen3moe": (QWEN3_30B_A3B_2L, Qwen3MoeConfig, Qwen3MoeForCausalLM),
}

# Keys of a config.json that describe the file, not the model: not constructor arguments.
FILE_KEYS = ("architectures", "model_type", "torch_dtype", "transformers_version")


def write(model, hub_config, folder):
    """Save `model` in bf16, then put the Hub's config.json in place of the one transformers
    wrote (which would carry this transformers' version and every default spelled out)."""
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hub_config, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder that gets siglip/ and qwen/")
    ap.add_argument("extra", nargs="*", help=f"more LMs to write: {', '.join(sorted(EXTRA_LMS))}")
    ap.add_argument("--layers", type=int, default=0, help="layers per tower (0: the Hub's)")
    args = ap.parse_args()
    unknown = sorted(set(args.extra) - set(EXTRA_LMS))
    if unknown:
        ap.error(f"unknown LM {', '.join(unknown)} (choose from {', '.join(sorted(EXTRA_LMS))})")
    siglip, qwen = copy.deepcopy(SIGLIP_SO400M_384), copy.deepcopy(QWEN25_05B)
    extra = {name: copy.deepcopy(EXTRA_LMS[name][0]) for name in args.extra}
    if args.layers:
        for tower in (siglip["text_config"], siglip["vision_config"], qwen, *extra.values()):
            tower["num_hidden_layers"] = args.layers
            if "max_window_layers" in tower:
                tower["max_window_layers"] = args.layers
    torch.manual_seed(0)
    start = time.perf_counter()

    config = SiglipConfig(text_config=siglip["text_config"], vision_config=siglip["vision_config"],
                          initializer_factor=siglip["initializer_factor"])
    write(SiglipModel(config), siglip, os.path.join(args.out, "siglip"))
    print(f"siglip written in {time.perf_counter() - start:.0f}s", flush=True)

    config = Qwen2Config(**{k: v for k, v in qwen.items() if k not in FILE_KEYS})
    write(Qwen2ForCausalLM(config), qwen, os.path.join(args.out, "qwen"))
    print(f"qwen written in {time.perf_counter() - start:.0f}s", flush=True)

    for name, hub in extra.items():
        _, config_class, model_class = EXTRA_LMS[name]
        config = config_class(**{k: v for k, v in hub.items() if k not in FILE_KEYS})
        write(model_class(config), hub, os.path.join(args.out, name))
        print(f"{name} written in {time.perf_counter() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
