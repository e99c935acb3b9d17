#!/usr/bin/env python3
"""Greedy tokens of a `tessera export --format llava-hf` directory for one or more images and
no text, as transformers computes them: its own processor (AutoProcessor: the SigLIP image
processor and the export's tokenizer) is given the images and `text = image_token * len(images)`
(each placeholder expanded to `image_seq_length` tokens), then `generate` runs greedily.

Usage: .deps/hfvenv/bin/python tests/oracles/transformers_generate.py EXPORT_DIR N IMAGE [IMAGE ...]

Prints one JSON line {"tokens": [...], "text": "..."}: the generated ids (a stop token
included, as transformers returns it) and their decoding without special tokens.
`tessera generate --model EXPORT_DIR --image A --image B` generates the same for the same images
(tests/multi_image.rs). `.deps/hfvenv` is made by scripts/setup/setup.sh.
"""
import json
import sys

import torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    export, new_tokens, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    model, info = LlavaForConditionalGeneration.from_pretrained(
        export, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{export}: transformers loads it with {problems}")
    model.eval()
    processor = AutoProcessor.from_pretrained(export)
    images = [Image.open(p).convert("RGB") for p in paths]
    token = processor.tokenizer.convert_ids_to_tokens(model.config.image_token_index)
    batch = processor(images=images, text=token * len(images), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    tokens = out[0, batch["input_ids"].shape[1]:].tolist()
    text = processor.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    print(json.dumps({"tokens": tokens, "text": text}))


if __name__ == "__main__":
    main()
