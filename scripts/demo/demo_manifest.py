#!/usr/bin/env python3
"""Writes demo-models/MANIFEST.json from the last JSON lines of the two pretraining runs of the
demo's LM that scripts/demo/make_demo_models.sh makes: its folder, recipe (the script's arguments), seeds,
held-out scores, a provenance line (the demo prints it), the sha256 of every file, and the
reduced-budget run's arguments and measures (its losses, an output norm and every tensor's
norm: tests/demo_parts.rs reruns it and compares them within a relative tolerance).

Usage: python3 scripts/demo/demo_manifest.py PARTS_DIR LM.log LM_REDUCED.log
"""
import hashlib
import json
import os
import sys


def last_json(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    if not lines:
        sys.exit(f"{path}: no result line (did the run finish?)")
    return json.loads(lines[-1])


def flag(args, name):
    return args[args.index(name) + 1]


def seeds(args):
    return [int(s) for s in flag(args, "--seeds").split(",")]


def sums(folder):
    return {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
            for f in sorted(os.listdir(folder))}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out = sys.argv[1]
    lm, lm_r = (last_json(p) for p in sys.argv[2:])
    m = json.load(open(os.path.join(out, "lm", "config.json")))
    lm_seeds = seeds(lm["args"])
    texts = len(lm_seeds) * int(flag(lm["args"], "--records")) - int(flag(lm["args"], "--held-out"))
    parts = {
        "lm": {
            "folder": "lm", "made_by": "scripts/demo/pretrain_lm.py", "args": lm["args"],
            "seeds": lm_seeds, "held_out_loss": lm["held_out_loss"],
            "sha256": sums(os.path.join(out, "lm")),
            "provenance": (
                f"Qwen2 LM (hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, Qwen's "
                f"{m['vocab_size']:,}-id vocabulary) pretrained by scripts/demo/pretrain_lm.py on "
                f"{texts:,} synth captions and conversations (seeds "
                f"{', '.join(map(str, lm_seeds))}), each caption read off word slots in its "
                f"context; text only: it has never seen an image"),
            "reduced": {"args": lm_r["args"], "measures": lm_r["measures"]},
        },
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        json.dump({"parts": parts}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
