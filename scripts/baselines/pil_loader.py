#!/usr/bin/env python3
"""PIL baseline for `tessera bench loader`: what a LLaVA-style PyTorch data pipeline does to each
image before the vision tower sees it, timed on the same files tessera's loader reads.

Measures: images/s of the full per-image preprocessing, spread over WORKERS processes the way
a torch DataLoader with num_workers=WORKERS spreads it, each preprocessed array shipped back to
the parent process (as a DataLoader hands batches to the training loop). Per image:
  1. PIL decode, converted to RGB;
  2. pad to a square canvas of the mean colour, image centred (LLaVA's `expand2square`,
     mean 0.5 -> fill (127, 127, 127));
  3. bicubic resize to SIZE x SIZE;
  4. scale to [0, 1], normalise with mean 0.5 / std 0.5 (SigLIP), lay out as CHW float32.
An image PIL cannot open is counted in failed= and the run goes on.

Run:
  python3 scripts/baselines/pil_loader.py LLAVA_JSON IMAGE_ROOT [--size 384] [--workers 2] [--limit N]
LLAVA_JSON is a LLaVA-Pretrain style list of records; those with an "image" key are loaded from
IMAGE_ROOT/<image>. `tessera bench loader` runs it with the images of the shards it measured
(exported to a temporary folder) and --size/--workers equal to its own --image-size/--threads;
set TESSERA_REFERENCE_LOADER to this file's path to pick it.

Prints one line, the one `tessera bench loader` parses (key=value, images_per_s= required):
  images=N seconds=S images_per_s=R failed=F
Needs: a python3 with pillow and numpy (.deps/venv has both).
"""
import argparse
import json
import os
import time
from multiprocessing import Pool

import numpy as np
from PIL import Image

MEAN = 0.5  # SigLIP's image_mean and image_std, all three channels
STD = 0.5
PAD_RGB = (int(MEAN * 255),) * 3  # LLaVA pads with the mean colour in 0..255: (127, 127, 127)

_side = 384  # set in every worker by _configure


def _configure(side):
    global _side
    _side = side


def pad_to_square(img):
    """Centre `img` on a square canvas of PAD_RGB whose side is the longer of its two sides."""
    width, height = img.size
    if width == height:
        return img
    side = max(width, height)
    canvas = Image.new(img.mode, (side, side), PAD_RGB)
    canvas.paste(img, ((side - width) // 2, (side - height) // 2))
    return canvas


def preprocess(path):
    """One image file -> (3, side, side) float32 array, or None when PIL cannot read it."""
    try:
        rgb = Image.open(path).convert("RGB")  # as LLaVA's dataset reads it
    except Exception:  # a bad file is reported in the count, not fatal
        return None
    square = pad_to_square(rgb).resize((_side, _side), Image.BICUBIC)
    hwc = np.asarray(square, dtype=np.float32) / 255.0
    hwc = (hwc - MEAN) / STD
    return hwc.transpose(2, 0, 1).copy()  # CHW, contiguous


def image_paths(llava_json, root, limit):
    with open(llava_json) as f:
        records = json.load(f)
    paths = [os.path.join(root, rec["image"]) for rec in records if "image" in rec]
    return paths[:limit] if limit else paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="LLaVA-style json: a list of records, images under 'image'")
    ap.add_argument("root", help="folder the records' image paths are relative to")
    ap.add_argument("--size", type=int, default=384, help="output side in pixels")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (DataLoader num_workers)")
    ap.add_argument("--limit", type=int, default=0, help="first N images only (0: all)")
    args = ap.parse_args()

    paths = image_paths(args.json, args.root, args.limit)
    failed = 0
    start = time.perf_counter()  # pool start-up counts: a DataLoader pays it every epoch too
    with Pool(args.workers, initializer=_configure, initargs=(args.size,)) as pool:
        for chw in pool.imap(preprocess, paths, chunksize=16):
            failed += chw is None
    seconds = time.perf_counter() - start
    rate = len(paths) / seconds if seconds > 0 else 0.0
    print(f"images={len(paths)} seconds={seconds:.3f} images_per_s={rate:.1f} failed={failed}")


if __name__ == "__main__":
    main()
