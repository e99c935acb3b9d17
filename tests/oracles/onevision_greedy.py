#!/usr/bin/env python3
"""Greedy tokens of a `tessera export --format llava-onevision` directory, as transformers makes
them through its own `LlavaOnevisionProcessor` and `LlavaOnevisionForConditionalGeneration`.

Usage: .deps/hfvenv/bin/python tests/oracles/onevision_greedy.py EXPORT CASES.json VIEWS.safetensors N LOGITS

CASES.json: a list of cases, each a list of image paths (one prompt of those images).
VIEWS.safetensors: `views.K` [views, 3, S, S] u8, tessera's loader's views of case K (each image's
base view then its tiles; an image of a several-image case its base view alone).

The export is loaded in f32 (any missing, unexpected or mismatched weight fails, naming them) and
its processor with `AutoProcessor.from_pretrained`. For each case: the user turn of its images
through the export's chat template (`add_generation_prompt`), then the processor on that text and
the images. Prints one JSON line per case:
  prompt_ids     the processor's ids (each image token expanded as it counts it)
  tokens         N greedy tokens from the processor's own pixels
  tokens_ours    N greedy tokens with tessera's views in place of the processor's
  level_diff     mean |processor - tessera| of the views both hold, in 0-255 levels
and writes LOGITS (safetensors): `logits.K` [vocab] f32, the logits after case K's prompt with
tessera's views.
"""
import json
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import AutoProcessor, LlavaOnevisionForConditionalGeneration


def greedy(model, inputs, n):
    with torch.no_grad():
        ids = model.generate(**inputs, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return ids[0, inputs["input_ids"].shape[1]:].tolist()


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    export, cases, views, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    logits_out = {}
    model, info = LlavaOnevisionForConditionalGeneration.from_pretrained(
        export, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{export}: transformers loads it with {problems}")
    model.eval()
    model.generation_config.eos_token_id = None  # N tokens whatever they are
    processor = AutoProcessor.from_pretrained(export)
    mean = torch.tensor(processor.image_processor.image_mean).view(3, 1, 1)
    std = torch.tensor(processor.image_processor.image_std).view(3, 1, 1)
    ours_all = load_file(views)
    for k, paths in enumerate(json.load(open(cases))):
        images = [Image.open(p).convert("RGB") for p in paths]
        content = [{"type": "image"} for _ in images]
        text = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True
        )
        # One prompt's images as one nested list: the processor then counts them as the images
        # of one sample (`batch_num_images`), which OneVision gives their base view alone.
        inputs = processor(text=text, images=[images], return_tensors="pt")
        pixels = inputs["pixel_values"]  # [images, max views, 3, S, S]
        ours = ours_all[f"views.{k}"].float() / 255.0
        ours = (ours - mean) / std
        # Each image's views in tessera's order: all of a lone image's, the base view of an
        # image among several (the only one the model reads for those).
        counts = [pixels.shape[1]] if len(images) == 1 else [1] * len(images)
        substituted, diffs, at = pixels.clone(), [], 0
        for i, count in enumerate(counts):
            mine = ours[at:at + count]
            at += count
            theirs = pixels[i, :count]
            diffs.append(((theirs - mine) * std * 255).abs().mean().item())
            substituted[i, :count] = mine
        if at != ours.shape[0]:
            sys.exit(f"case {k}: tessera has {ours.shape[0]} views, the processor {at}")
        ours_inputs = {**inputs, "pixel_values": substituted}
        with torch.no_grad():
            logits_out[f"logits.{k}"] = model(**ours_inputs).logits[0, -1].float().contiguous()
        line = {
            "prompt_ids": inputs["input_ids"][0].tolist(),
            "tokens": greedy(model, dict(inputs), n),
            "tokens_ours": greedy(model, ours_inputs, n),
            "level_diff": float(np.mean(diffs)),
        }
        print(json.dumps(line))
    save_file(logits_out, sys.argv[5])


if __name__ == "__main__":
    main()
