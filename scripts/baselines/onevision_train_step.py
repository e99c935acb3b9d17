#!/usr/bin/env python3
"""transformers baseline for tessera's AnyRes stage 1 step: the LLaVA-OneVision step a user would
run instead, PyTorch eager + transformers, on the samples tessera's run trained at each step.

The model is a `tessera export --format llava-onevision` folder (LlavaOnevisionForConditionalGeneration,
f32), trained as stage 1 trains it: the projector and image_newline, everything else frozen, AdamW
(lr 1e-3, no weight decay), gradient-norm clip 1.0. Each step takes the samples `plan.jsonl` lists
for it from the shards (ingest's parquet: images and token ids), decodes their images with PIL and
runs them through the export's own LlavaOnevisionProcessor (AnyRes views, image tokens expanded)
as one right-padded batch (transformers has no packing); the loss is the LM's cross-entropy on
each sample's last `num_supervised_tokens` tokens (its caption). Timed per optimizer step: the
processor, forward, backward, clip and AdamW.

Run: .deps/hfvenv/bin/python scripts/baselines/onevision_train_step.py EXPORT SHARDS PLAN [--steps N] [--threads 2]
Prints one line per step "step <i>: <seconds>s loss <loss> tokens <padded> images <n> views <v>"
and last "BASELINE median s/step <m> (excl. first)".
"""
import argparse
import io
import json
import os
import statistics
import time

import pyarrow.parquet as pq
import torch
from PIL import Image
from transformers import AutoProcessor, LlavaOnevisionForConditionalGeneration


def read_samples(shards):
    """Every sample of the shard set, in the global order tessera numbers them."""
    index = json.load(open(os.path.join(shards, "index.json")))
    names = [s["file"] for s in index["shards"]]
    out = []
    for name in names:
        table = pq.read_table(os.path.join(shards, name),
                              columns=["images", "input_ids", "num_supervised_tokens"])
        out.extend(table.to_pylist())
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("export")
    p.add_argument("shards")
    p.add_argument("plan")
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = LlavaOnevisionForConditionalGeneration.from_pretrained(a.export, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(a.export)
    tokenizer = processor.tokenizer
    image_id = processor.image_token_id
    for name, param in model.named_parameters():
        param.requires_grad = "multi_modal_projector" in name or name.endswith("image_newline")
    trained = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-3, weight_decay=0.0)
    model.train()
    samples = read_samples(a.shards)
    steps = [json.loads(line)["samples"] for line in open(a.plan) if line.strip()]
    if a.steps:
        steps = steps[: a.steps]
    times = []
    for i, indices in enumerate(steps):
        batch = [samples[k] for k in indices]
        started = time.perf_counter()
        texts, images = [], []
        for s in batch:
            ids = s["input_ids"]
            texts.append(tokenizer.decode(ids, skip_special_tokens=False))
            images.append([Image.open(io.BytesIO(im["bytes"])).convert("RGB") for im in s["images"]])
        tokenizer.padding_side = "right"
        inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
        labels = torch.full_like(inputs["input_ids"], -100)
        lengths = inputs["attention_mask"].sum(1).tolist()
        for row, (s, n) in enumerate(zip(batch, lengths)):
            k = s["num_supervised_tokens"] + 1
            labels[row, n - k:n] = inputs["input_ids"][row, n - k:n]
        labels[inputs["input_ids"] == image_id] = -100
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        times.append(seconds)
        views = int(inputs["pixel_values"].shape[0] * inputs["pixel_values"].shape[1])
        print(f"step {i}: {seconds:.3f}s loss {loss.item():.4f} tokens {inputs['input_ids'].numel()} "
              f"images {sum(len(x) for x in images)} views {views}", flush=True)
    rest = times[1:] or times
    print(f"BASELINE median s/step {statistics.median(rest):.3f} (excl. first)")


if __name__ == "__main__":
    main()
