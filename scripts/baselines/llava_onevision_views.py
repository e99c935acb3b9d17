#!/usr/bin/env python3
"""Baseline for `cargo bench --bench anyres_views`: transformers' own
LlavaOnevisionImageProcessor (anyres, pinpoints 384·{1..6}², 384-pixel tiles, bicubic, mean and
std 0.5) over image files, spread over WORKERS processes as a torch DataLoader with
num_workers=WORKERS spreads it (each worker at one torch thread, as DataLoader workers run).
Per image: PIL decode, converted to RGB; the processor's base view and tiles, rescaled and
normalised. The pixel arrays are not shipped back to the parent (a DataLoader would ship them:
the baseline is timed without that cost).

Run: python scripts/baselines/llava_onevision_views.py WORKERS ROUNDS IMAGE [IMAGE ...]
Prints one line: images=N tiles=T seconds=S tiles_per_s=R processor=CLASS
CLASS is the backend transformers picked: LlavaOnevisionImageProcessor (torchvision, its
default when torchvision is installed, as scripts/setup/setup.sh installs it) or
LlavaOnevisionImageProcessorPil (its fallback without torchvision, about half as fast here).
Needs: a Python with transformers, torch, torchvision and pillow (.deps/hfvenv).
"""
import sys
import time
from multiprocessing import Pool

_processor = None


def _start():
    global _processor
    import torch
    from transformers import LlavaOnevisionImageProcessor

    torch.set_num_threads(1)
    _processor = LlavaOnevisionImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3)


def _views(path):
    from PIL import Image

    image = Image.open(path).convert("RGB")
    return int(_processor(images=image, return_tensors="pt")["pixel_values"].shape[1])


def main():
    workers, rounds, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    _start()
    backend = type(_processor).__name__
    with Pool(workers, initializer=_start) as pool:
        pool.map(_views, paths[:workers])  # warm-up: imports and first calls
        started = time.perf_counter()
        tiles = sum(sum(pool.map(_views, paths, chunksize=1)) for _ in range(rounds))
        seconds = time.perf_counter() - started
    print(f"images={len(paths) * rounds} tiles={tiles} seconds={seconds:.3f} "
          f"tiles_per_s={tiles / seconds:.2f} processor={backend}")


if __name__ == "__main__":
    main()
