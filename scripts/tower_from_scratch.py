#!/usr/bin/env python3
"""How many images the demo's vision tower needs to learn a synth scene's shape when it trains
from its random init (what `--train vision` would do in `make demo`), against a small CNN on the
same images as a control that the shapes are visible at the tower's resolution at all.

Each reader classifies the shape of single-object synth scenes ("a SIZE COLOUR SHAPE on a BG
background"), 5 classes, with the easiest read-out there is: per-patch MLP, max over patches,
linear. The tower is the SiglipVisionModel that `tessera init-model` wrote (its select layer,
-2, as the demo reads it), trained with AdamW at --lr (default 1e-3) together with the reader.

Usage (the Python of scripts/setup.sh's .deps/hfvenv):
  .deps/hfvenv/bin/python scripts/tower_from_scratch.py VISION_DIR TRAIN_SYNTH VAL_SYNTH [--lr X]
VISION_DIR: model/vision of `tessera init-model --preset tiny`; *_SYNTH: folders written by
`tessera synth --text-only-fraction 0` (12,000 and 600 records give about 3,700 and 190
single-object scenes). Prints validation accuracy after each pass over the training images,
with the number of images presented so far, until 40,000.
"""
import json
import sys

import numpy as np
import torch
from PIL import Image
from transformers import SiglipVisionModel

SHAPES = ["circle", "square", "triangle", "diamond", "cross"]
PRESENTED = 40_000
BATCH = 32


def single_object_scenes(folder, side):
    pixels, labels = [], []
    for record in json.load(open(f"{folder}/blip_laion_cc_sbu_558k.json")):
        words = record["conversations"][1]["value"].split() if "image" in record else []
        if len(words) == 8 and words[0] == "a" and words[-1] == "background":
            image = Image.open(f"{folder}/images/{record['image']}").convert("RGB")
            pixels.append(np.asarray(image.resize((side, side), Image.BICUBIC)))
            labels.append(SHAPES.index(words[3]))
    x = torch.tensor(np.stack(pixels)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return x, torch.tensor(labels)


class TowerReader(torch.nn.Module):
    def __init__(self, tower):
        super().__init__()
        self.tower = tower
        dim = tower.config.hidden_size
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 128), torch.nn.GELU())
        self.head = torch.nn.Linear(128, len(SHAPES))

    def forward(self, x):
        patches = self.tower(pixel_values=x, output_hidden_states=True).hidden_states[-2]
        return self.head(self.mlp(patches).max(1).values)


def cnn_reader():
    conv = lambda cin, cout: [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.ReLU()]
    return torch.nn.Sequential(
        *conv(3, 32), torch.nn.MaxPool2d(2), *conv(32, 64), torch.nn.MaxPool2d(2), *conv(64, 64),
        torch.nn.AdaptiveMaxPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, len(SHAPES)))


def train(name, reader, groups, data):
    (x, y), (x_val, y_val) = data
    opt = torch.optim.AdamW(groups)
    presented, line = 0, []
    while presented < PRESENTED:
        order = torch.randperm(len(x))
        for start in range(0, len(x) - BATCH + 1, BATCH):
            batch = order[start:start + BATCH]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(reader(x[batch]), y[batch]).backward()
            opt.step()
            presented += BATCH
        with torch.no_grad():
            accuracy = (reader(x_val).argmax(1) == y_val).float().mean().item()
        line.append(f"{presented}: {accuracy:.0%}")
    print(f"{name}: shape accuracy on {len(x_val)} held-out scenes (chance 20%) after N images "
          f"-- " + ", ".join(line), flush=True)


def main():
    args = sys.argv[1:]
    lr = 1e-3
    if len(args) == 5 and args[3] == "--lr":
        lr = float(args[4])
        args = args[:3]
    if len(args) != 3:
        sys.exit(__doc__)
    torch.set_num_threads(2)
    tower = SiglipVisionModel.from_pretrained(args[0])
    side = tower.config.image_size
    data = single_object_scenes(args[1], side), single_object_scenes(args[2], side)
    print(f"{len(data[0][1])} training and {len(data[1][1])} held-out single-object scenes at "
          f"{side} px, patch {tower.config.patch_size}")
    torch.manual_seed(0)
    reader = TowerReader(tower)
    train(f"tower from its init (lr {lr:g}) + max-pool reader", reader,
          [{"params": reader.tower.parameters(), "lr": lr},
           {"params": [*reader.mlp.parameters(), *reader.head.parameters()], "lr": 1e-3}], data)
    torch.manual_seed(0)
    cnn = cnn_reader()
    train("control: 3-layer CNN (lr 1e-3)", cnn, [{"params": cnn.parameters(), "lr": 1e-3}], data)


if __name__ == "__main__":
    main()
