#!/usr/bin/env python3
"""Oracle for pipeline/src/loader/anyres_views.rs: the views transformers' own
LlavaOnevisionImageProcessor cuts from images (pinpoints 384·{1..6}², 384-pixel tiles, bicubic),
its normalisation undone (mean and std 0.5), as u8 values.

Run: python tests/oracles/anyres_views.py OUT IMAGE [IMAGE ...]   (a Python with transformers)
OUT (safetensors): `views.i` [tiles, 3, 384, 384] f32 holding 0-255, for the i-th IMAGE.
"""
import sys

from PIL import Image
from safetensors.torch import save_file
from transformers import LlavaOnevisionImageProcessor

processor = LlavaOnevisionImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)
out = {}
for i, path in enumerate(sys.argv[2:]):
    image = Image.open(path).convert("RGB")
    pixels = processor(images=image, return_tensors="pt")["pixel_values"][0]
    out[f"views.{i}"] = ((pixels * 0.5 + 0.5) * 255).round().contiguous()
save_file(out, sys.argv[1])
