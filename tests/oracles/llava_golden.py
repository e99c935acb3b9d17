#!/usr/bin/env python3
"""LLaVA fixtures for tessera's export and generation parity tests
(trainer/train/tests/fsdp_vlm/llava.rs).

Builds a tiny random transformers `LlavaForConditionalGeneration` out of the golden fixtures
that tests/oracles/golden.py wrote (SigLIP tower `vision/`, untied Qwen2 `lm_untied/` with
vocabulary 512, LLaVA's projector `projector.safetensors`), with tessera's LLaVA settings
(vision_feature_layer -2, strategy "full", projector_hidden_act "gelu", no pooling head), and
writes under
tests/fixtures/llava/:

  expected.json        the tensor names and shapes `save_pretrained` writes, and the config
                       fields tessera's `export --format llava-hf` must match;
  outputs.safetensors  pixels_u8 [2,3,32,32], prompt_ids [P] (placeholder id 299 expanded to
                       image_seq_length copies), for image i: prompt_logits_i [P,512] (one
                       forward over the prompt), tokens_i [N] (greedy generation, KV cache) and
                       step_logits_i [N,512] (the logits each generated token was picked from).

Run by hand (not in CI), from the repository root:
  data/hfvenv/bin/python tests/oracles/llava_golden.py            # write the fixtures
  data/hfvenv/bin/python tests/oracles/llava_golden.py --check DIR
      # DIR: an export tessera wrote (`LLAVA_EXPORT_DIR=DIR cargo test --release -p trainer
      # --test model llava` keeps the fixture's export there, in f32; or any
      # `tessera export --format llava-hf` output). Loads it with from_pretrained, fails on any
      # missing, unexpected or mismatched key, and for the fixture's weights compares greedy
      # tokens and logits with outputs.safetensors; when the directory holds a tokenizer, also
      # loads AutoProcessor and checks it expands the image token to image_seq_length copies.
"""
import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    LlavaConfig,
    LlavaForConditionalGeneration,
    Qwen2Config,
    SiglipVisionConfig,
)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
GOLDEN = os.path.join(ROOT, "golden")
OUT = os.path.join(ROOT, "llava")
IMAGE_ID = 299
NEW_TOKENS = 8
# The config fields the Rust test compares (top level, then vision_config / text_config).
TOP_FIELDS = [
    "model_type", "image_token_index", "image_seq_length", "projector_hidden_act",
    "vision_feature_layer", "vision_feature_select_strategy", "multimodal_projector_bias",
    "tie_word_embeddings",
]
VISION_FIELDS = [
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "image_size", "patch_size", "hidden_act", "layer_norm_eps", "vision_use_head",
]
TEXT_FIELDS = [
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings",
]


def build():
    vision = json.load(open(os.path.join(GOLDEN, "vision", "config.json")))
    vision_cfg = SiglipVisionConfig(**{k: v for k, v in vision.items() if k in VISION_FIELDS})
    vision_cfg.vision_use_head = False
    text_cfg = Qwen2Config.from_pretrained(os.path.join(GOLDEN, "lm_untied"))
    tokens = (vision_cfg.image_size // vision_cfg.patch_size) ** 2
    cfg = LlavaConfig(
        vision_config=vision_cfg.to_dict(), text_config=text_cfg.to_dict(),
        image_token_index=IMAGE_ID, image_seq_length=tokens, projector_hidden_act="gelu",
        vision_feature_layer=-2, vision_feature_select_strategy="full",
        tie_word_embeddings=text_cfg.tie_word_embeddings,
    )
    cfg._attn_implementation = "eager"
    model = LlavaForConditionalGeneration(cfg).eval()
    state = {}
    for k, v in load_file(os.path.join(GOLDEN, "vision", "model.safetensors")).items():
        k = k.removeprefix("vision_model.")  # older files nest the tower under vision_model.
        if not k.startswith("head."):
            state[f"model.vision_tower.{k}"] = v
    for k, v in load_file(os.path.join(GOLDEN, "lm_untied", "model.safetensors")).items():
        if k.startswith("model."):
            state[f"model.language_model.{k[len('model.'):]}"] = v
        else:
            state[k] = v
    for k, v in load_file(os.path.join(GOLDEN, "projector.safetensors")).items():
        linear = {"0": "linear_1", "2": "linear_2"}[k.split(".")[1]]
        state[f"model.multi_modal_projector.{linear}.{k.split('.')[2]}"] = v
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to embed_tokens
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model, tokens


def inputs(tokens):
    golden = load_file(os.path.join(GOLDEN, "outputs.safetensors"))
    pixels = golden["pixels_u8"]
    prompt = [7, 8] + [IMAGE_ID] * tokens + [20, 21, 22]
    return pixels, torch.tensor(prompt)


def run(model, pixels, prompt):
    out = {}
    pixel_values = (pixels.float() / 255.0 - 0.5) / 0.5
    for i in range(pixels.shape[0]):
        ids = prompt.unsqueeze(0)
        pv = pixel_values[i : i + 1]
        with torch.no_grad():
            full = model(input_ids=ids, pixel_values=pv)
            gen = model.generate(
                input_ids=ids, pixel_values=pv, max_new_tokens=NEW_TOKENS, do_sample=False,
                output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                pad_token_id=0,
            )
        out[f"prompt_logits_{i}"] = full.logits[0]
        out[f"tokens_{i}"] = gen.sequences[0, prompt.shape[0]:]
        out[f"step_logits_{i}"] = torch.cat(gen.logits, 0)
    return out


def write():
    torch.use_deterministic_algorithms(True)
    model, tokens = build()
    pixels, prompt = inputs(tokens)
    outputs = {"pixels_u8": pixels.to(torch.int64), "prompt_ids": prompt}
    outputs.update(run(model, pixels, prompt))
    os.makedirs(OUT, exist_ok=True)
    outputs = {k: v.contiguous() for k, v in outputs.items()}
    save_file(outputs, os.path.join(OUT, "outputs.safetensors"), metadata={"format": "pt"})

    tmp = os.path.join(OUT, "_saved")
    model.save_pretrained(tmp, safe_serialization=True)
    with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
        keys = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    config = json.load(open(os.path.join(tmp, "config.json")))
    for name in os.listdir(tmp):
        os.remove(os.path.join(tmp, name))
    os.rmdir(tmp)
    expected = {
        "tensors": dict(sorted(keys.items())),
        "config": {k: config[k] for k in TOP_FIELDS if k in config},
        "vision_config": {k: config["vision_config"][k] for k in VISION_FIELDS},
        "text_config": {k: config["text_config"][k] for k in TEXT_FIELDS},
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {OUT} ({total / 1e6:.2f} MB); tokens {[outputs[f'tokens_{i}'].tolist() for i in range(2)]}",
          file=sys.stderr)


def check(path):
    model, info = LlavaForConditionalGeneration.from_pretrained(
        path, output_loading_info=True, dtype=torch.float32, attn_implementation="eager",
    )
    model.eval()
    bad = {k: v for k, v in info.items() if v}
    print(f"{path}: loading info {info}")
    assert not bad, f"from_pretrained reported {bad}"
    cfg = model.config
    tokens = cfg.image_seq_length
    if cfg.text_config.vocab_size == 512:
        expected = load_file(os.path.join(OUT, "outputs.safetensors"))
        got = run(model, expected["pixels_u8"], expected["prompt_ids"])
        for k, v in got.items():
            ref = expected[k]
            if k.startswith("tokens"):
                assert torch.equal(v, ref), (k, v.tolist(), ref.tolist())
            else:
                err = (v - ref).abs().max().item()
                assert err < 1e-4, (k, err)
        print("greedy tokens and logits equal the fixture")
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        from PIL import Image
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path)
        size = cfg.vision_config.image_size
        image = Image.new("RGB", (size * 2, size), (200, 30, 30))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        batch = processor(images=image, text=text, return_tensors="pt")
        count = int((batch["input_ids"] == cfg.image_token_index).sum())
        assert count == tokens, f"processor made {count} image tokens, config says {tokens}"
        assert list(batch["pixel_values"].shape) == [1, 3, size, size], batch["pixel_values"].shape
        print(f"{type(processor).__name__}: {count} image tokens, template {text!r}")
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=4, do_sample=False)
        print("generated:", processor.batch_decode(out[:, batch['input_ids'].shape[1]:]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", metavar="DIR")
    args = parser.parse_args()
    if args.check:
        check(args.check)
    else:
        write()


if __name__ == "__main__":
    main()
