"""Rewrites a format-4 checkpoint folder, in place, as tessera wrote format 3 before format 4
existed, so a test can check that such old checkpoints still resume.

Format 4: every rank's `shards.safetensors` holds its slice of each trained flat buffer
(`{buffer}.param`, `.exp_avg`, `.exp_avg_sq`) and `optimizer.step`; rank 0's `layout.json`
maps parameters to offsets in the buffers. Format 3: rank 0 alone holds the trained state as
full tensors per parameter: `trainable.safetensors` (`{name}`, f32) and `optimizer.safetensors`
(`{name}.exp_avg`, `{name}.exp_avg_sq`, `optimizer.step`). Both keep `state.json` and a
`manifest.json` (sha256 of every other file) per rank and `meta.json` with the format number.

usage: checkpoint_to_format3.py CHECKPOINT_DIR   (needs numpy and safetensors)
"""
import hashlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def rank_dir(ckpt, rank):
    return os.path.join(ckpt, f"rank-{rank:05d}")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def full_tensors(layout, shards):
    """Parameters and moments as full tensors, named as format 3 names them."""
    params, optimizer = {}, {}
    for buffer in layout["buffers"]:
        for part, out, suffix in (
            ("param", params, ""),
            ("exp_avg", optimizer, ".exp_avg"),
            ("exp_avg_sq", optimizer, ".exp_avg_sq"),
        ):
            flat = np.concatenate([s[f"{buffer['key']}.{part}"] for s in shards])
            for p in buffer["params"]:
                n = int(np.prod(p["shape"], dtype=np.int64))
                piece = flat[p["offset"] : p["offset"] + n].reshape(p["shape"])
                out[p["name"] + suffix] = np.ascontiguousarray(piece)
    optimizer["optimizer.step"] = shards[0]["optimizer.step"]
    return params, optimizer


def main(ckpt):
    meta_path = os.path.join(ckpt, "meta.json")
    meta = json.load(open(meta_path))
    if meta["format_version"] != 4:
        sys.exit(f"{meta_path}: format {meta['format_version']}, not 4")
    layout = json.load(open(os.path.join(rank_dir(ckpt, 0), "layout.json")))
    shards = [
        load_file(os.path.join(rank_dir(ckpt, r), "shards.safetensors"))
        for r in range(layout["writers"])
    ]
    params, optimizer = full_tensors(layout, shards)
    for rank in range(meta["world_size"]):
        folder = rank_dir(ckpt, rank)
        for name in ("shards.safetensors", "layout.json"):
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
        if rank == 0:
            save_file(params, os.path.join(folder, "trainable.safetensors"))
            save_file(optimizer, os.path.join(folder, "optimizer.safetensors"))
        files = sorted(f for f in os.listdir(folder) if f != "manifest.json")
        manifest = {f: sha256(os.path.join(folder, f)) for f in files}
        with open(os.path.join(folder, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    meta["format_version"] = 3
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
