#!/usr/bin/env python3
"""What transformers computes for a tessera export or a language model folder (f32, CPU): the
one oracle the tests run it through, as three subcommands. `.deps/hfvenv` is made by
scripts/setup/setup.sh. Every model is loaded with `output_loading_info`: any missing,
unexpected or mismatched weight fails (exit 1, naming the keys).

  greedy EXPORT_DIR INPUTS.safetensors N
      A `tessera export --format llava-hf` folder (LlavaForConditionalGeneration). INPUTS holds
      `prompt_ids` [P] (the image placeholder already expanded to image_seq_length copies) and
      `pixel_values` [images, 3, S, S] (normalised as the export's image processor does). For
      each image, N tokens are generated greedily (KV cache) after the prompt, whatever they are
      (no end token stops or is masked). Prints {"tokens": [[...], ...]}; when the export has
      processor files, also "processor_prompt_ids": what its `AutoProcessor` (a LlavaProcessor)
      makes of a user turn holding one image and "Describe the image." through the export's chat
      template with the assistant's header, the image token expanded as it expands it.
      Run by trainer/train/tests/fsdp_vlm/llava.rs and tests/families.rs.

  generate EXPORT_DIR N IMAGE [IMAGE ...]
      The export's own processor (AutoProcessor) is given the images and `text = image_token *
      len(images)`, then `generate` runs greedily. Prints {"tokens": [...], "text": "..."}: the
      generated ids (a stop token included, as transformers returns it) and their decoding
      without special tokens; `tessera generate --model EXPORT_DIR --image A --image B`
      generates the same (tests/multi_image.rs).

  chat LM_DIR PROMPT OUT.safetensors N
      One user turn through the model's own chat template (`apply_chat_template`,
      `add_generation_prompt=True`); `AutoModelForCausalLM` gives the prompt's logits, saved to
      OUT (`prompt_ids` [P], `logits` [P, V]), and answers greedily (at most N new tokens,
      stopping where its generation config says). Prints {"prompt_ids": [...], "tokens": [...],
      "text": "..."}. trainer/model/tests/model/families.rs compares tessera's numbers and answer
      with these on SmolLM2-135M-Instruct.
"""
import json
import os
import sys

import numpy as np
import torch


def load_llava(export):
    from transformers import LlavaForConditionalGeneration
    model, info = LlavaForConditionalGeneration.from_pretrained(
        export, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{export}: transformers loads it with {problems}")
    return model.eval()


def processor_prompt_ids(export, side):
    """The export's processor on one image and an instruction, as a user of transformers runs it."""
    from transformers import AutoProcessor
    processor = AutoProcessor.from_pretrained(export)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Describe the image."}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = np.zeros((side, side, 3), dtype=np.uint8)
    return processor(text=text, images=[image], return_tensors="pt")["input_ids"][0].tolist()


def greedy(export, inputs, new_tokens):
    from safetensors.torch import load_file
    model = load_llava(export)
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
                max_new_tokens=int(new_tokens),
                do_sample=False,
                pad_token_id=0,
            )
        out.append(ids[0, prompt.shape[1]:].tolist())
    line = {"tokens": out}
    if os.path.isfile(os.path.join(export, "processor_config.json")):
        side = tensors["pixel_values"].shape[-1]
        line["processor_prompt_ids"] = processor_prompt_ids(export, side)
    return line


def generate(export, new_tokens, *paths):
    from PIL import Image
    from transformers import AutoProcessor
    if not paths:
        sys.exit(__doc__)
    model = load_llava(export)
    processor = AutoProcessor.from_pretrained(export)
    images = [Image.open(p).convert("RGB") for p in paths]
    token = processor.tokenizer.convert_ids_to_tokens(model.config.image_token_index)
    batch = processor(images=images, text=token * len(images), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=int(new_tokens), do_sample=False)
    tokens = out[0, batch["input_ids"].shape[1]:].tolist()
    text = processor.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return {"tokens": tokens, "text": text}


def chat(folder, prompt, out, new_tokens):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True,
        return_tensors="pt", return_dict=True,
    )["input_ids"]
    model, info = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{folder}: transformers loads it with {problems}")
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits[0]
        answer = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(new_tokens),
            do_sample=False,
        )[0, ids.shape[1]:]
    save_file({"prompt_ids": ids[0].contiguous(), "logits": logits.contiguous()}, out)
    return {
        "prompt_ids": ids[0].tolist(),
        "tokens": answer.tolist(),
        "text": tokenizer.decode(answer, skip_special_tokens=True),
    }


COMMANDS = {"greedy": (greedy, 3), "generate": (generate, None), "chat": (chat, 4)}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    command, arity = COMMANDS[sys.argv[1]]
    args = sys.argv[2:]
    if (arity is not None and len(args) != arity) or len(args) < 2:
        sys.exit(__doc__)
    print(json.dumps(command(*args)))


if __name__ == "__main__":
    main()
