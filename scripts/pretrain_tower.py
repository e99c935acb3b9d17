#!/usr/bin/env python3
"""Pretrains the demo's tiny SigLIP vision tower on drawn scenes and saves it as a
`SiglipVisionModel` checkpoint (config.json + model.safetensors) that tessera and transformers
load: the repo's miniature of the pretrained SigLIP that LLaVA starts from.

Objective: a supervised head on the scene's labels, read from the caption that `tessera synth`
writes with each scene (not SigLIP's sigmoid image-text loss: the labels are exact, so the
tower learns in minutes what a contrastive loss against caption embeddings teaches slowly).
  * objects: which (size, colour, shape) the caption names (2 x 8 x 5 = 80 classes), and which
    colours (8) and shapes (5) alone, multi-label. A linear layer scores every patch token and
    the scene's score per class is the maximum over patches (sigmoid cross-entropy, positives
    weighted up: a scene has 1 to 3 of 80), so each object must show in a patch token of its
    own, which is what a projector and an LM read later.
  * background: its colour (6 classes, softmax) from the mean of the patch tokens.
Both heads read `hidden_states[-2]`, the layer LLaVA (and tessera) take features from, and the
same two heads read the last layer after `post_layernorm`, so every weight of the checkpoint is
trained. The heads are not saved.

Scenes: `tessera synth --text-only-fraction 0` with the seeds of --seeds (default 100, 101),
which differ from the demo's (0: training, 1: validation; tests/demo_parts.rs checks); the last
--held-out scenes are kept out of training and scored at the end. Images are read as the
trainer's loader reads them (DCT-domain downscale, then bicubic to image_size x image_size,
SigLIP's normalisation); random horizontal flips (the labels are sets, so a flip keeps them).

Usage (the Python of scripts/setup.sh's .deps/hfvenv):
  .deps/hfvenv/bin/python scripts/pretrain_tower.py --out DIR [--scenes N] [--epochs E] ...
  --reproducible: one thread and libtorch's portable kernels, so that a run's numbers differ
  from machine to machine only in their last bits (not bit for bit: an AMD EPYC and an Intel
  Xeon made different bytes).
Prints the loss per epoch, the held-out scores, and a last JSON line with the recipe, the
held-out scores, the sha256 of model.safetensors and `measures`: the loss of every epoch and
of the last step, the norm of the features of the first 8 training scenes, and the norm of
every saved tensor but the key biases (see `measures`). tests/demo_parts.rs reruns a reduced
run and compares its measures with the ones demo-models/MANIFEST.json records, within a
relative tolerance.
"""
import argparse
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for config.json + model.safetensors")
    p.add_argument("--work", help="folder for the synth scenes (default OUT.scenes, removed)")
    p.add_argument("--tessera", default="target/release/tessera")
    p.add_argument("--seeds", default="100,101", help="synth seeds, comma-separated")
    p.add_argument("--scenes", type=int, default=16000, help="scenes per seed")
    p.add_argument("--held-out", type=int, default=500)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="torch's seed (init, order, flips)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reproducible", action="store_true")
    return p.parse_args()


ARGS = parse_args()
if ARGS.reproducible:
    # Before torch loads: scalar ATen kernels, MKL's conditional numerical reproducibility,
    # oneDNN (the patch convolution) capped at a baseline ISA.
    os.environ["ATEN_CPU_CAPABILITY"] = "default"
    os.environ["MKL_CBWR"] = "COMPATIBLE"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "SSE41"
    ARGS.threads = 1

import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import SiglipVisionConfig, SiglipVisionModel  # noqa: E402

# synth's vocabulary (synth/src/scene.rs).
SHAPES = ["circle", "square", "triangle", "diamond", "cross"]
COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "white", "black"]
BACKGROUNDS = ["grey", "white", "black", "blue", "green", "brown"]
SIZES = ["large", "small"]
OBJECT = re.compile(rf"\b({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})\b")
BACKGROUND = re.compile(rf"on a ({'|'.join(BACKGROUNDS)}) background$")
CLASSES = len(SIZES) * len(COLOURS) * len(SHAPES)
OUTPUTS = CLASSES + len(COLOURS) + len(SHAPES)
POSITIVE_WEIGHT = 10.0


def labels(caption):
    """(multi-hot over the 80 objects, then the 8 colours and 5 shapes; background index) of
    a synth caption."""
    objects = OBJECT.findall(caption)
    bg = BACKGROUND.search(caption)
    if not objects or bg is None:
        raise ValueError(f"not a synth scene caption: {caption!r}")
    hot = np.zeros(OUTPUTS, dtype=np.float32)
    for size, colour, shape in objects:
        hot[object_class(size, colour, shape)] = 1.0
        hot[CLASSES + COLOURS.index(colour)] = 1.0
        hot[CLASSES + len(COLOURS) + SHAPES.index(shape)] = 1.0
    return hot, BACKGROUNDS.index(bg.group(1))


def object_class(size, colour, shape):
    return (SIZES.index(size) * len(COLOURS) + COLOURS.index(colour)) * len(SHAPES) + SHAPES.index(shape)


def load_image(path, side):
    """As the loader: DCT-domain downscale where it keeps `side`, then bicubic (squash)."""
    with Image.open(path) as im:
        im.draft("RGB", (side, side))
        return np.asarray(im.convert("RGB").resize((side, side), Image.BICUBIC))


def scenes(tessera, work, seed, count, side):
    folder = os.path.join(work, f"seed-{seed}")
    subprocess.run([tessera, "synth", "--quiet", "--out", folder, "--samples", str(count),
                    "--text-only-fraction", "0", "--seed", str(seed)], check=True)
    with open(os.path.join(folder, "blip_laion_cc_sbu_558k.json")) as f:
        records = json.load(f)
    pixels, objects, backgrounds = [], [], []
    for record in records:
        hot, bg = labels(record["conversations"][1]["value"])
        pixels.append(load_image(os.path.join(folder, "images", record["image"]), side))
        objects.append(hot)
        backgrounds.append(bg)
    shutil.rmtree(folder)
    return np.stack(pixels), np.stack(objects), np.array(backgrounds)


class Pretraining(torch.nn.Module):
    """The tower plus its two label heads on the feature layer and on the last layer."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower
        dim = tower.config.hidden_size
        self.objects = torch.nn.ModuleList([torch.nn.Linear(dim, OUTPUTS) for _ in range(2)])
        self.background = torch.nn.ModuleList(
            [torch.nn.Linear(dim, len(BACKGROUNDS)) for _ in range(2)])

    def forward(self, x):
        out = self.tower(pixel_values=x, output_hidden_states=True)
        features = out.hidden_states[-2]
        inner = getattr(self.tower, "vision_model", self.tower)  # transformers 5 flattened it
        last = inner.post_layernorm(out.hidden_states[-1])
        return [(self.objects[i](h).amax(1), self.background[i](h.mean(1)))
                for i, h in enumerate([features, last])]


def normalise(u8):
    """SigLIP's processor: x / 255, then (x - 0.5) / 0.5; NHWC u8 -> NCHW f32."""
    return torch.from_numpy(u8).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def loss_of(outputs, objects, backgrounds):
    weight = torch.full((OUTPUTS,), POSITIVE_WEIGHT)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    ce = torch.nn.functional.cross_entropy
    return sum(bce(o, objects, pos_weight=weight) + ce(b, backgrounds) for o, b in outputs)


def scores(model, pixels, objects, backgrounds):
    """Held-out scores of the feature layer's heads: a scene's objects are the classes scored
    above 0 (exact set right), the background the argmax, and the first-named object alone."""
    model.eval()
    with torch.no_grad():
        logits, bg = [], []
        for start in range(0, len(pixels), 256):
            (o, b), _ = model(normalise(pixels[start:start + 256]))
            logits.append(o)
            bg.append(b)
    model.train()
    predicted = torch.cat(logits)[:, :CLASSES] > 0
    truth = torch.from_numpy(objects[:, :CLASSES]) > 0.5
    return {
        "object_sets_exact": (predicted == truth).all(1).float().mean().item(),
        "objects_found": (predicted & truth).sum().item() / max(truth.sum().item(), 1),
        "false_objects": (predicted & ~truth).sum().item() / max(predicted.sum().item(), 1),
        "background": (torch.cat(bg).argmax(1) == torch.from_numpy(backgrounds)).float().mean().item(),
    }


def tower_config(args):
    return SiglipVisionConfig(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_channels=3,
        image_size=args.image_size, patch_size=args.patch_size,
        hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attention_dropout=0.0,
        vision_use_head=False)


def save(tower, out):
    """config.json + model.safetensors as tessera's init-model writes a tower: the Hub's key
    names (`vision_model.` first; transformers 5 drops the prefix in its own state dict and
    adds it back when loading), no pooling head. Returns the file's sha256 and the tensors
    saved, by key."""
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for key, value in tower.state_dict().items():
        key = key if key.startswith("vision_model.") else "vision_model." + key
        tensors[key] = value.detach().contiguous()
    path = os.path.join(out, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    cfg = tower.config
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({
            "architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model",
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "num_channels": 3,
            "image_size": cfg.image_size, "patch_size": cfg.patch_size,
            "hidden_act": cfg.hidden_act, "layer_norm_eps": cfg.layer_norm_eps,
            "attention_dropout": 0.0, "vision_use_head": False, "torch_dtype": "float32",
        }, f, indent=2)
        f.write("\n")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), tensors


def significant(x):
    """`x` to 7 significant digits: the measures' precision in the manifest."""
    return float(f"{x:.7g}")


def measures(epoch_losses, last_loss, tower, pixels, tensors):
    """What the run made, as numbers that hold across CPUs to far better than the test's
    tolerance: the loss of every epoch and of the last step, the L2 norm of the feature layer
    (`hidden_states[-2]`) for `pixels`, and the L2 norm of every saved tensor but the key
    biases. A key bias adds the same number to every score of a query's row, which the softmax
    ignores, so its gradient is rounding noise that AdamW scales up to full steps: its norm
    moved by 27-32% between libtorch's portable and fast kernels, the other numbers by at most
    5e-7 (relative)."""
    tower.eval()
    with torch.no_grad():
        out = tower(pixel_values=normalise(pixels), output_hidden_states=True)
        features = out.hidden_states[-2]
    return {
        "epoch_losses": [significant(v) for v in epoch_losses],
        "last_step_loss": significant(last_loss),
        "features_norm": significant(features.double().norm().item()),
        "tensor_norms": {k: significant(v.double().norm().item())
                         for k, v in sorted(tensors.items())
                         if not k.endswith("self_attn.k_proj.bias")},
    }


def check_reload(tower, out, pixels):
    """transformers loads the saved folder into the same tower: same features, bit for bit."""
    again = SiglipVisionModel.from_pretrained(out).eval()
    tower.eval()
    with torch.no_grad():
        x = normalise(pixels)
        a = tower(pixel_values=x, output_hidden_states=True).hidden_states[-2]
        b = again(pixel_values=x, output_hidden_states=True).hidden_states[-2]
    if not torch.equal(a, b):
        raise SystemExit(f"{out}: transformers loads other weights than were trained")


def recipe_args():
    """The command line less where it writes: what makes_demo_models.sh records."""
    out, skip = [], False
    for word in sys.argv[1:]:
        if skip:
            skip = False
        elif word in ("--out", "--work", "--tessera"):
            skip = True
        else:
            out.append(word)
    return out


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.reproducible:
        torch.use_deterministic_algorithms(True)
    work = args.work or args.out.rstrip("/") + ".scenes"
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    parts = [scenes(args.tessera, work, s, args.scenes, args.image_size) for s in seeds]
    shutil.rmtree(work, ignore_errors=True)
    pixels, objects, backgrounds = (np.concatenate([p[i] for p in parts]) for i in range(3))
    held = min(args.held_out, len(pixels) // 5)
    train = (pixels[:-held], objects[:-held], backgrounds[:-held]) if held else (pixels, objects, backgrounds)
    test = (pixels[-held:], objects[-held:], backgrounds[-held:]) if held else None
    print(f"{len(train[0])} training scenes (seeds {args.seeds}), {held} held out, "
          f"{args.image_size} px; read in {time.time() - t0:.0f}s", flush=True)

    tower = SiglipVisionModel(tower_config(args))
    model = Pretraining(tower)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    steps_per_epoch = len(train[0]) // args.batch
    total = max(steps_per_epoch * args.epochs, 1)
    warmup = max(total // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + np.cos(np.pi * min(s / total, 1.0)))))
    x_all, o_all, b_all = train
    epoch_losses = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(x_all)).numpy()
        losses = []
        for i in range(steps_per_epoch):
            batch = order[i * args.batch:(i + 1) * args.batch]
            x = normalise(x_all[batch])
            flip = torch.rand(len(batch)) < 0.5
            x[flip] = x[flip].flip(3)
            loss = loss_of(model(x), torch.from_numpy(o_all[batch]), torch.from_numpy(b_all[batch]))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())
        epoch_losses.append(float(np.mean(losses)))
        line = f"epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}"
        if test is not None:
            line += " held out: " + ", ".join(f"{k} {v:.1%}" for k, v in scores(model, *test).items())
        print(f"{line} ({time.time() - t0:.0f}s)", flush=True)
    last_loss = losses[-1] if args.epochs and losses else float("nan")
    digest, tensors = save(tower, args.out)
    check_reload(tower, args.out, x_all[:8])
    held_out = scores(model, *test) if test is not None else None
    print(json.dumps({"sha256": digest, "args": recipe_args(), "held_out": held_out,
                      "measures": measures(epoch_losses, last_loss, tower, x_all[:8], tensors)}))


if __name__ == "__main__":
    sys.exit(main())
