#!/usr/bin/env python3
"""Tiny random-weight models of one family, written by transformers itself, and their outputs.

Usage: .deps/hfvenv/bin/python tests/oracles/family_parity.py OUT [FAMILY ...]

FAMILY (all of them when none is named; one Python start-up for all, as importing torch and
transformers takes most of the time) is one of
  qwen3       Qwen3ForCausalLM: q/k norms, no bias, head_dim 16 (not hidden/heads = 12), tied
  llama       LlamaForCausalLM as SmolLM2: no bias, rope_theta 1e5, rms_norm_eps 1e-5, untied
  llama-bias  LlamaForCausalLM with attention_bias and mlp_bias, head_dim 16, tied
  siglip2     a SigLIP-2 fixed-resolution checkpoint's layout (a whole SiglipModel, model_type
              "siglip", its vision_config nested) at image 36, patch 8 (the convolution drops
              the remainder: 4x4 patches)

Writes OUT/FAMILY/model/ (save_pretrained, safetensors) and OUT/FAMILY/outputs.safetensors:
for an LM,
input_ids / positions [2,12] (the second row starting at position 3), labels (already shifted,
-100 where not supervised, as tessera's MicroBatch holds them), logits [2,12,V] and loss
(transformers' mean over the unshifted labels); for the tower, pixels_u8 [2,3,36,36] (int64),
pixel_values and vision_features (hidden_states[-2], the layer before the last, as LLaVA reads).
Every parameter is perturbed so that a swapped or unused weight cannot go unnoticed.
trainer/model/tests/model/families.rs runs it (from scripts/setup/setup.sh's .deps/hfvenv) and checks
tessera's numbers against these (f32, within 1e-4).
"""
import os
import sys

import torch
from safetensors.torch import save_file

VOCAB = 512
SEQ = 12


def perturbed(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def lm_model(family):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation="eager",
    )
    if family == "qwen3":
        cfg = Qwen3Config(
            head_dim=16, tie_word_embeddings=True, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common,
        )
        return Qwen3ForCausalLM(cfg)
    if family == "llama":
        cfg = LlamaConfig(
            tie_word_embeddings=False, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, **common,
        )
        return LlamaForCausalLM(cfg)
    cfg = LlamaConfig(  # llama-bias
        head_dim=16, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common,
    )
    return LlamaForCausalLM(cfg)


def lm(out, family):
    torch.manual_seed(0)
    model = perturbed(lm_model(family), 1)
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    gen = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    positions = torch.stack([torch.arange(SEQ), torch.arange(3, 3 + SEQ)])
    labels = input_ids.clone()
    labels[0, :4] = -100
    labels[1, 5:8] = -100
    with torch.no_grad():
        result = model(input_ids=input_ids, position_ids=positions, labels=labels)
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]
    return {
        "input_ids": input_ids,
        "positions": positions,
        "labels": shifted,
        "logits": result.logits,
        "loss": result.loss.reshape(1),
    }


def siglip2(out):
    from transformers import SiglipConfig, SiglipModel

    torch.manual_seed(0)
    cfg = SiglipConfig(
        text_config=dict(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=8, bos_token_id=None,
            eos_token_id=None,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            image_size=36, patch_size=8,
        ),
    )
    model = perturbed(SiglipModel(cfg), 1)
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    gen = torch.Generator().manual_seed(2)
    pixels = torch.randint(0, 256, (2, 3, 36, 36), generator=gen)
    pixel_values = (pixels.float() / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        result = model.vision_model(pixel_values=pixel_values, output_hidden_states=True)
    return {
        "pixels_u8": pixels.to(torch.int64),
        "pixel_values": pixel_values,
        "vision_features": result.hidden_states[-2],
    }


FAMILIES = ["qwen3", "llama", "llama-bias", "siglip2"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root, families = sys.argv[1], sys.argv[2:] or FAMILIES
    torch.use_deterministic_algorithms(True)
    for family in families:
        if family not in FAMILIES:
            sys.exit(f"unknown family {family!r}\n\n{__doc__}")
        out = os.path.join(root, family)
        os.makedirs(out, exist_ok=True)
        outputs = siglip2(out) if family == "siglip2" else lm(out, family)
        outputs = {k: v.contiguous() for k, v in outputs.items()}
        save_file(outputs, os.path.join(out, "outputs.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main()
