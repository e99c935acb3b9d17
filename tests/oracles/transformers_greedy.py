#!/usr/bin/env python3
"""Greedy tokens of a `tessera export --format llava-hf` directory, as transformers computes them.

Usage: .deps/hfvenv/bin/python tests/oracles/transformers_greedy.py EXPORT_DIR INPUTS.safetensors N

INPUTS holds `prompt_ids` [P] (the image placeholder already expanded to image_seq_length
copies) and `pixel_values` [images, 3, S, S] (normalised as the SigLIP processor does). The
export is loaded with `LlavaForConditionalGeneration.from_pretrained` in f32; any missing,
unexpected or mismatched weight fails (exit 1, naming the keys). For each image, N tokens are
generated greedily (KV cache) after the prompt, whatever they are (no end token stops or is
masked); prints one JSON line {"tokens": [[...], ...]}. When the export has processor files, the
line also holds "processor_prompt_ids": what its `AutoProcessor` (a LlavaProcessor) makes of a
user turn holding one image and "Describe the image." through the export's chat template with
the assistant's header (`add_generation_prompt`), the image token expanded as it expands it.
trainer/train/tests/fsdp_vlm/llava.rs compares them with tessera's `Generator` on a full
fine-tune's export. `.deps/hfvenv` is made by scripts/setup/setup.sh.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoProcessor, LlavaForConditionalGeneration


def processor_prompt_ids(export, side):
    """The export's processor on one image and an instruction, as a user of transformers runs it."""
    processor = AutoProcessor.from_pretrained(export)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Describe the image."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = np.zeros((side, side, 3), dtype=np.uint8)
    return processor(text=text, images=[image], return_tensors="pt")["input_ids"][0].tolist()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    export, inputs, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model, info = LlavaForConditionalGeneration.from_pretrained(
        export, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{export}: transformers loads it with {problems}")
    model.eval()
    # N tokens whatever they are: tessera's side generates without stop ids too.
    model.generation_config.eos_token_id = None
    tensors = load_file(inputs)
    prompt = tensors["prompt_ids"].long().unsqueeze(0)
    out = []
    for pixels in tensors["pixel_values"].float():
        with torch.no_grad():
            ids = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                pixel_values=pixels.unsqueeze(0),
                max_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        out.append(ids[0, prompt.shape[1]:].tolist())
    line = {"tokens": out}
    if os.path.isfile(os.path.join(export, "processor_config.json")):
        side = tensors["pixel_values"].shape[-1]
        line["processor_prompt_ids"] = processor_prompt_ids(export, side)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
