#!/usr/bin/env python3
"""One chat turn with a language model folder, as transformers computes it (f32, CPU).

Usage: .deps/hfvenv/bin/python tests/oracles/transformers_chat.py LM_DIR PROMPT OUT.safetensors N

The prompt goes through the model's own chat template (`apply_chat_template`, one user turn,
`add_generation_prompt=True`); the model (`AutoModelForCausalLM`, f32) gives the prompt's
logits, saved to OUT (`prompt_ids` [P], `logits` [P, V]), and answers greedily (at most N new
tokens, stopping where its generation config says). Prints one JSON line:
{"prompt_ids": [...], "tokens": [...], "text": "..."} (text: the new tokens decoded without
special tokens). trainer/model/tests/model/families.rs compares tessera's numbers and answer
with these on SmolLM2-135M-Instruct (.deps/smollm2-135m-instruct, from scripts/setup/setup.sh).
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    folder, prompt, out, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True,
        return_tensors="pt", return_dict=True,
    )["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(ids).logits[0]
        answer = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
            do_sample=False,
        )[0, ids.shape[1]:]
    save_file({"prompt_ids": ids[0].contiguous(), "logits": logits.contiguous()}, out)
    print(json.dumps({
        "prompt_ids": ids[0].tolist(),
        "tokens": answer.tolist(),
        "text": tokenizer.decode(answer, skip_special_tokens=True),
    }))


if __name__ == "__main__":
    main()
