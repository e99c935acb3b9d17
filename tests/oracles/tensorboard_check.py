#!/usr/bin/env python3
"""Reads a run folder's TensorBoard event files with TensorBoard's own reader and checks that
they hold exactly the scalars of its metrics.jsonl: every tag at every step, each value equal
to the metrics line's as f32 (TensorBoard's scalar type), and nothing else.

Usage: .deps/venv/bin/python tests/oracles/tensorboard_check.py RUN_DIR
(`tensorboard` is installed there by scripts/setup/setup.sh). Prints one JSON line: the steps, the
number of scalars and the points per tag; exits 1 naming the first difference.
"""
import json
import os
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# tag -> the metrics.jsonl value (None: no point at this step), as report/tensorboard.rs maps.
FIXED = {
    "loss/all": lambda m: m["loss"],
    "loss/image": lambda m: m.get("loss_image"),
    "loss/text_only": lambda m: m.get("loss_text"),
    "loss/validation": lambda m: m.get("val_loss"),
    "optimizer/lr": lambda m: m["lr"],
    "optimizer/grad_norm": lambda m: m["grad_norm"],
    "throughput/tokens_per_s": lambda m: m["tokens_per_s"],
    "throughput/real_tokens_per_s": lambda m: m["real_tokens_per_s"],
    "throughput/images_per_s": lambda m: m["images_per_s"],
    "time/step_s": lambda m: m["step_time_s"],
    "time/imbalance": lambda m: m["imbalance"],
}
PER_RANK = ["loader_wait_frac", "compute_s", "peak_rss_mib"]


def expected(metrics_path):
    want = {}
    with open(metrics_path) as f:
        for line in f:
            if not line.strip():
                continue
            m = json.loads(line)
            for tag, get in FIXED.items():
                if get(m) is not None:
                    want[(tag, m["step"])] = get(m)
            for name, v in m.get("loss_by_source", {}).items():
                want[(f"loss_by_source/{name}", m["step"])] = v
            for name in PER_RANK:
                for rank, v in enumerate(m["per_rank"][name]):
                    want[(f"{name}/rank{rank}", m["step"])] = v
            moe = m.get("moe")
            if moe is not None:
                want[("moe/aux_loss", m["step"])] = moe["aux_loss"]
                for layer, v in moe["load_max_over_mean"].items():
                    want[(f"moe/load_max_over_mean/layer_{layer}", m["step"])] = v
    return want


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    if not any("tfevents" in name for name in os.listdir(run)):
        sys.exit(f"{run}: no events.out.tfevents.* file")
    want = expected(os.path.join(run, "metrics.jsonl"))
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    got = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            if (tag, event.step) in got:
                sys.exit(f"{run}: {tag} has two points at step {event.step}")
            got[(tag, event.step)] = event.value
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        sys.exit(f"{run}: events lack {missing[:5]} and hold {extra[:5]} beyond metrics.jsonl")
    for key, value in sorted(want.items()):
        if np.float32(value) != np.float32(got[key]):
            sys.exit(f"{run}: {key[0]} at step {key[1]} is {got[key]} in the events, "
                     f"{value} in metrics.jsonl")
    per_tag = {}
    for tag, _ in want:
        per_tag[tag] = per_tag.get(tag, 0) + 1
    print(json.dumps({"steps": len({s for _, s in want}), "scalars": len(want),
                      "points_per_tag": per_tag}))


if __name__ == "__main__":
    main()
