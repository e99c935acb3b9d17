#!/usr/bin/env python3
"""How much of a synth scene a (frozen) vision tower's patch features give away, measured with
the best reader the demo's model could learn: a per-patch MLP (the projector's shape) followed by
attention pooling (what one LM attention head can do) and a linear classifier, trained on
single-object synth images for the background colour, the object's colour and its shape.

Why: `make demo`'s caption score needs the shape word, and the tiny preset's random tower turns
a 64 px image into 8x8-pixel patch vectors. This probe says how many image presentations a
dedicated reader needs to tell the shape from those features at all; the demo sees a few
thousand.

Usage (the Python of scripts/setup.sh's .deps/hfvenv, which has torch and transformers):
  .deps/hfvenv/bin/python scripts/vision_probe.py VISION_DIR TRAIN_SYNTH_DIR VAL_SYNTH_DIR
VISION_DIR: a SiglipVisionModel folder (`tessera init-model` writes one as model/vision);
*_SYNTH_DIR: folders `tessera synth` wrote (blip_laion_cc_sbu_558k.json + images/). Prints the
validation accuracy of each probe after 5, 20 and 40 epochs, beside chance.
"""
import json
import sys

import numpy as np
import torch
from PIL import Image
from transformers import SiglipVisionModel

COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "white", "black"]
BACKGROUNDS = ["grey", "white", "black", "blue", "green", "brown"]
SHAPES = ["circle", "square", "triangle", "diamond", "cross"]
LIMIT = 1500


def single_object_records(folder):
    """Image records whose caption is exactly 'a SIZE COLOUR SHAPE on a BG background'."""
    records = json.load(open(f"{folder}/blip_laion_cc_sbu_558k.json"))
    kept = []
    for record in records:
        if "image" not in record:
            continue
        words = record["conversations"][1]["value"].split()
        if len(words) == 8 and words[0] == "a" and words[-1] == "background":
            kept.append((f"{folder}/images/{record['image']}", words))
    return kept[:LIMIT]


def features(model, records, side):
    """Patch features at the demo's select layer (-2), the labels of each record."""
    mean = torch.full((3, 1, 1), 0.5)
    pixels = []
    for path, _ in records:
        image = Image.open(path).convert("RGB").resize((side, side), Image.BICUBIC)
        x = torch.tensor(np.asarray(image), dtype=torch.float32).permute(2, 0, 1) / 255.0
        pixels.append((x - mean) / 0.5)
    with torch.no_grad():
        hidden = model(pixel_values=torch.stack(pixels), output_hidden_states=True).hidden_states
    labels = {
        "background colour": [BACKGROUNDS.index(w[-2]) for _, w in records],
        "object colour": [COLOURS.index(w[2]) for _, w in records],
        "shape": [SHAPES.index(w[3]) for _, w in records],
    }
    return hidden[-2], {k: torch.tensor(v) for k, v in labels.items()}


class Reader(torch.nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU()
        )
        self.query = torch.nn.Parameter(torch.randn(128) * 0.1)
        self.head = torch.nn.Linear(128, classes)

    def forward(self, patches):
        z = self.mlp(patches)
        weights = torch.softmax(z @ self.query, dim=1).unsqueeze(-1)
        return self.head((weights * z).sum(1))


def probe(name, train, val, y, y_val, classes):
    torch.manual_seed(0)
    reader = Reader(train.shape[-1], classes)
    opt = torch.optim.AdamW(reader.parameters(), 3e-3, weight_decay=0.01)
    report = []
    for epoch in range(1, 41):
        order = torch.randperm(train.shape[0])
        for start in range(0, train.shape[0], 64):
            batch = order[start:start + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(reader(train[batch]), y[batch]).backward()
            opt.step()
        if epoch in (5, 20, 40):
            with torch.no_grad():
                accuracy = (reader(val).argmax(1) == y_val).float().mean().item()
            report.append(f"{epoch} epochs ({epoch * train.shape[0]} images) {accuracy:.0%}")
    print(f"{name:18} chance {1 / classes:.0%}; " + "; ".join(report), flush=True)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model = SiglipVisionModel.from_pretrained(sys.argv[1]).eval()
    side = model.config.image_size
    train_records = single_object_records(sys.argv[2])
    val_records = single_object_records(sys.argv[3])
    if not train_records or not val_records:
        sys.exit("no single-object synth record found")
    train, labels = features(model, train_records, side)
    val, val_labels = features(model, val_records, side)
    scale = train.std((0, 1)) + 1e-6
    shift = train.mean((0, 1))
    train, val = (train - shift) / scale, (val - shift) / scale
    print(f"{len(train_records)} training and {len(val_records)} validation single-object images, "
          f"{train.shape[1]} patch features of {train.shape[2]} each")
    for name, classes in [("background colour", 6), ("object colour", 8), ("shape", 5)]:
        probe(name, train, val, labels[name], val_labels[name], classes)


if __name__ == "__main__":
    main()
