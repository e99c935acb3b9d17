#!/usr/bin/env python3
"""Golden fixtures for tessera's model parity tests (trainer/model/tests/model/golden.rs).

Builds tiny random-weight models with transformers itself -- a SiglipVisionModel, a tied and an
untied Qwen2ForCausalLM (vocabulary 512 so the fixtures stay small), and LLaVA's mlp2x_gelu
projector -- saves them with save_pretrained (safetensors) under tests/fixtures/golden/, and
saves their outputs for fixed inputs in tests/fixtures/golden/outputs.safetensors:

  pixels_u8 [2,3,32,32] (int64 holding 0..255), pixel_values (normalised, f32),
  vision_features   = hidden_states[-2] of SiglipVisionModel (layer before the last, no post-LN),
  projected         = mm_projector(vision_features),
  {tied,untied}_input_ids / _positions [2,12], _logits [2,12,512],
  {tied,untied}_labels (already shifted, -100 where not supervised, as MicroBatch holds them),
  {tied,untied}_loss  = transformers' mean loss for the unshifted labels.

Run by hand (not in CI), from the repository root:
  .deps/venv/bin/pip install transformers
  .deps/venv/bin/python tests/oracles/golden.py
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM, SiglipVisionConfig, SiglipVisionModel

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "golden")
VOCAB = 512
SEQ = 12


def vision(outputs):
    torch.manual_seed(0)
    cfg = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        image_size=32, patch_size=8, attn_implementation="eager",
    )
    model = SiglipVisionModel(cfg).eval()
    # Random init leaves some parameters at constants (zeros / ones): perturb every tensor so a
    # swapped or unused weight cannot go unnoticed.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(os.path.join(OUT, "vision"), safe_serialization=True)
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (2, 3, 32, 32), generator=gen)
    pixel_values = (pixels.float() / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        out = model(pixel_values=pixel_values, output_hidden_states=True)
    features = out.hidden_states[-2]
    outputs["pixels_u8"] = pixels.to(torch.int64)
    outputs["pixel_values"] = pixel_values
    outputs["vision_features"] = features

    torch.manual_seed(2)
    projector = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 48))
    with torch.no_grad():
        outputs["projected"] = projector(features)
    state = {f"mm_projector.{k}": v.contiguous() for k, v in projector.state_dict().items()}
    save_file(state, os.path.join(OUT, "projector.safetensors"), metadata={"format": "pt"})


def lm(outputs, name, tied, seed, rope_theta):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
        max_position_embeddings=128, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(os.path.join(OUT, name), safe_serialization=True)
    if not tied:
        # Exercise the top-level `rope_theta` form that released Qwen2.5 configs use.
        path = os.path.join(OUT, name, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.pop("rope_parameters", None)
        config["rope_theta"] = rope_theta
        with open(path, "w") as f:
            json.dump(config, f, indent=2)

    gen = torch.Generator().manual_seed(seed + 100)
    input_ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    positions = torch.stack([torch.arange(SEQ), torch.arange(3, 3 + SEQ)])
    labels = input_ids.clone()
    labels[0, :4] = -100
    labels[1, 5:8] = -100
    with torch.no_grad():
        out = model(input_ids=input_ids, position_ids=positions, labels=labels)
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]
    outputs[f"{name}_input_ids"] = input_ids
    outputs[f"{name}_positions"] = positions
    outputs[f"{name}_logits"] = out.logits
    outputs[f"{name}_labels"] = shifted
    outputs[f"{name}_loss"] = out.loss.reshape(1)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    outputs = {}
    vision(outputs)
    lm(outputs, "lm_tied", tied=True, seed=10, rope_theta=10000.0)
    lm(outputs, "lm_untied", tied=False, seed=20, rope_theta=1000000.0)
    outputs = {k: v.contiguous() for k, v in outputs.items()}
    save_file(outputs, os.path.join(OUT, "outputs.safetensors"), metadata={"format": "pt"})
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
