#!/usr/bin/env python3
"""Oracle for trainer/model/src/anyres.rs: transformers' own
`LlavaOnevisionModel.pack_image_features` (pinpoints 384·{1..6}², so400m-384: 27x27 patches a
tile) over the features in IN, and the gradients of sum(packed * cotangent).

Run: python tests/oracles/anyres_pack.py N IN OUT   (a Python with transformers)
IN (safetensors): for each image i, `features.i` [tiles, 729, D], `cotangent.i` [tokens, D],
`size.i` [2] (height, width, as f32); `newline` [D]. OUT: `packed.i`, `grad_features.i` and
`grad_newline` (summed over the images).
"""
import sys
import types

import torch
from safetensors.torch import load_file, save_file
from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

max_tiles, src, dst = int(sys.argv[1]), sys.argv[2], sys.argv[3]
pinpoints = [[h * 384, w * 384] for h in range(1, 7) for w in range(1, 7)]
# The method reads only these attributes of the model.
model = types.SimpleNamespace(
    config=types.SimpleNamespace(
        vision_config=types.SimpleNamespace(image_size=384, patch_size=14),
        image_grid_pinpoints=pinpoints,
    )
)
tensors = load_file(src)
images = sorted(int(k.split(".")[1]) for k in tensors if k.startswith("features."))
newline = tensors["newline"].double().requires_grad_()
features = [tensors[f"features.{i}"].double().requires_grad_() for i in images]
sizes = torch.stack([tensors[f"size.{i}"].long() for i in images])
packed, lens = LlavaOnevisionModel.pack_image_features(
    model, features, sizes, image_newline=newline, vision_aspect_ratio=f"anyres_max_{max_tiles}"
)
loss = sum((p * tensors[f"cotangent.{i}"].double()).sum() for i, p in zip(images, packed))
loss.backward()
out = {"grad_newline": newline.grad.float()}
for i, p, f in zip(images, packed, features):
    out[f"packed.{i}"] = p.detach().float().contiguous()
    out[f"grad_features.{i}"] = f.grad.float().contiguous()
save_file(out, dst)
