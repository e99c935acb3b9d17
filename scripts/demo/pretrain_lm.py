#!/usr/bin/env python3
"""Pretrains the demo's tiny language model on synth text only (no images): a Qwen2 decoder
with Qwen's 151,936-token vocabulary that has learnt how synth captions and text-only
conversations read, and to take a caption's words from its context, but has never seen a
picture, so the demo's stage 1 must teach the projector to turn images into such context.

Text: the records `tessera synth --text-only-fraction 0.2` writes with the seeds of --seeds
(default 200, 201; the demo's are 0 and 1, tests/demo_parts.rs checks), tokenized as tessera's
`plain` template tokenizes them: a caption (after the image) is caption, "\\n", <|endoftext|>;
a text-only conversation is every turn's text and "\\n", then <|endoftext|>. Every token is a
target. The last --held-out records are scored at the end.

Context slots (what a real LM brings to LLaVA: it can use what its context says). Each caption
follows 64 positions, as many as the demo's image tokens, laid out as the tower's 8 x 8 patch
grid: an object of the caption fills a block of slots (3 x 3 large, 2 x 2 small) placed where
the caption's relation allows (above, left of, ...), each slot the sum of the object's size,
colour and shape word embeddings; every other slot holds the background colour's word; all get
Gaussian noise. The LM learns to read the caption off its context. Stage 1 then has to make the
projector map each patch of a picture to such a slot: the LM never sees pictures here.

Compact vocabulary: synth's text uses a few hundred of the 151,936 ids. The model trains only
those embedding rows (tied: they are the output head too) and keeps every other row at exactly
0, so each unused id has logit 0; the softmax over the full vocabulary is computed exactly as
the compact logits plus one logit log(151,936 - used) standing for all the zero rows. The saved
`compact.safetensors` holds the used rows (`model.embed_tokens.weight`, `[used, hidden]`) and
their ids (`token_ids`); scripts/demo/expand_lm.py writes the full `Qwen2ForCausalLM` checkpoint
(zeros elsewhere) that tessera and transformers load, the same model bit for bit.

Usage (the Python of scripts/setup/setup.sh's .deps/hfvenv):
  .deps/hfvenv/bin/python scripts/demo/pretrain_lm.py --out DIR [--records N] [--epochs E] ...
  --reproducible: one thread and libtorch's portable kernels (the same bits on every run of one CPU).
Prints the loss per epoch, held-out loss and a greedy caption, and a last JSON line with the
recipe, the held-out loss, the sha256 of compact.safetensors and `measures`: the loss of every
epoch and of the last step, the norm of the logits over the first training record, and the
norm of every saved float tensor (tests/demo_parts.rs compares a reduced run's with
demo-models/MANIFEST.json's, within a relative tolerance).
"""
import argparse
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for config.json + compact.safetensors")
    p.add_argument("--work", help="folder for the synth records (default OUT.records, removed)")
    p.add_argument("--tessera", default="target/release/tessera")
    p.add_argument("--tokenizer", default=".deps/tokenizer/tokenizer.json")
    p.add_argument("--seeds", default="200,201", help="synth seeds, comma-separated")
    p.add_argument("--records", type=int, default=4000, help="synth records per seed")
    p.add_argument("--held-out", type=int, default=400)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--slot-noise", type=float, default=0.1, help="std of each slot's noise")
    p.add_argument("--seed", type=int, default=0, help="torch's seed (init, order, layouts)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reproducible", action="store_true")
    return p.parse_args()


ARGS = parse_args()
if ARGS.reproducible:
    os.environ["ATEN_CPU_CAPABILITY"] = "default"
    os.environ["MKL_CBWR"] = "COMPATIBLE"
    os.environ["ONEDNN_MAX_CPU_ISA"] = "SSE41"
    ARGS.threads = 1

import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model  # noqa: E402

VOCAB = 151_936  # Qwen2.5's embedding rows
END_OF_TEXT = "<|endoftext|>"
IMAGE_PAD = "<|image_pad|>"
GRID = 8  # the demo tower's 64 px / patch 8
SLOTS = GRID * GRID
# synth's scene vocabulary (synth/src/scene.rs)
OBJECT = re.compile(r"\b(large|small) (\w+) (circle|square|triangle|diamond|cross)\b")
BACKGROUND = re.compile(r"on a (\w+) background$")
RELATIONS = ["above", "below", "to the left of", "to the right of"]


def records(tessera, work, seed, count):
    folder = os.path.join(work, f"seed-{seed}")
    subprocess.run([tessera, "synth", "--quiet", "--out", folder, "--samples", str(count),
                    "--text-only-fraction", "0.2", "--seed", str(seed)], check=True)
    with open(os.path.join(folder, "blip_laion_cc_sbu_558k.json")) as f:
        out = json.load(f)
    shutil.rmtree(folder)
    return out


def encode(tokenizer, text, drop_first=False):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ids[1:] if drop_first else ids


def caption_ids(tokenizer, caption):
    """The ids tessera's `plain` template gives an image sample's caption, after the image:
    ingest tokenizes `<|image_pad|>caption\\n<|endoftext|>` as one string."""
    ids = tokenizer.encode(f"{IMAGE_PAD}{caption}\n{END_OF_TEXT}", add_special_tokens=False).ids
    if ids[0] != tokenizer.token_to_id(IMAGE_PAD):
        raise ValueError(f"{caption!r}: the image placeholder did not come first")
    return ids[1:]


def conversation_ids(tokenizer, turns):
    """`plain` for a text-only conversation: each turn's text and "\\n", then <|endoftext|>."""
    text = "".join(t["value"] + "\n" for t in turns) + END_OF_TEXT
    return encode(tokenizer, text)


def word_ids(tokenizer, word):
    """The ids of ` word` as it appears inside a caption."""
    return encode(tokenizer, " " + word)


def layout(objects, relation, rng):
    """Top-left grid cells of each object's block (3 x 3 large, 2 x 2 small) such that the
    caption's relation holds and no blocks overlap; None after 200 tries."""
    sizes = [3 if size == "large" else 2 for size, _, _ in objects]
    for _ in range(200):
        cells = [(rng.randrange(GRID - s + 1), rng.randrange(GRID - s + 1)) for s in sizes]
        boxes = [(r, c, r + s - 1, c + s - 1) for (r, c), s in zip(cells, sizes)]
        if any(not (a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1])
               for i, a in enumerate(boxes) for b in boxes[i + 1:]):
            continue
        if len(boxes) == 2:
            a, b = boxes
            ok = {"above": a[2] < b[0], "below": b[2] < a[0],
                  "to the left of": a[3] < b[1], "to the right of": b[3] < a[1]}[relation]
        elif len(boxes) == 3:
            ok = boxes[0][3] < boxes[1][1] and boxes[1][3] < boxes[2][1]
        else:
            ok = True
        if ok:
            return boxes
    return None


def slot_words(tokenizer, caption, rng):
    """[SLOTS][3] compact-to-be ids (-1: none) of the words summed into each context slot."""
    objects = OBJECT.findall(caption)
    background = BACKGROUND.search(caption)
    if not objects or background is None:
        raise ValueError(f"not a synth scene caption: {caption!r}")
    relation = next((r for r in RELATIONS if f" {r} " in caption), None)
    boxes = layout(objects, relation, rng)
    if boxes is None:
        return None
    bg = word_ids(tokenizer, background.group(1))
    slots = [bg + [-1] * (3 - len(bg)) for _ in range(SLOTS)]
    for (size, colour, shape), (r0, c0, r1, c1) in zip(objects, boxes):
        words = [word_ids(tokenizer, w)[0] for w in (size, colour, shape)]
        for r in range(r0, r1 + 1):
            for c in range(c0, c1 + 1):
                slots[r * GRID + c] = words
    return slots


def config(args, vocab):
    return Qwen2Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, hidden_act="silu", max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
        attention_dropout=0.0, use_sliding_window=False)


class CompactLm(torch.nn.Module):
    """The decoder over the used ids; logits over the full vocabulary as used rows + one
    logit for the zero rows (each contributes exp(0) to the softmax)."""

    def __init__(self, cfg, unused, slot_noise):
        super().__init__()
        self.decoder = Qwen2Model(cfg)
        torch.nn.init.normal_(self.decoder.embed_tokens.weight, std=2.0 / math.sqrt(cfg.hidden_size))
        self.zero_rows = math.log(unused)
        self.slot_noise = slot_noise

    def embed(self, ids, slots):
        """Token embeddings, after the context slots when `slots` ([B, SLOTS, 3]) is given."""
        table = self.decoder.embed_tokens.weight
        x = table[ids]
        if slots is None:
            return x
        ctx = (table[slots.clamp(min=0)] * (slots >= 0).unsqueeze(-1)).sum(2)
        if self.training:
            ctx = ctx + self.slot_noise * torch.randn_like(ctx)
        return torch.cat([ctx, x], 1)

    def forward(self, ids, mask, slots=None):
        x = self.embed(ids, slots)
        if slots is not None:
            mask = torch.cat([torch.ones(mask.shape[0], SLOTS, dtype=mask.dtype), mask], 1)
        h = self.decoder(inputs_embeds=x, attention_mask=mask).last_hidden_state
        logits = h @ self.decoder.embed_tokens.weight.T
        rest = torch.full_like(logits[..., :1], self.zero_rows)
        return torch.cat([logits, rest], -1)


def batches(samples, size, order):
    """Batches of one kind (captions with slots, or conversations), padded on the right."""
    by_kind = {True: [], False: []}
    for i in order:
        by_kind[samples[i][1] is not None].append(i)
    out = []
    for kind, idx in by_kind.items():
        for start in range(0, len(idx), size):
            chunk = [samples[i] for i in idx[start:start + size]]
            n = max(len(s) for s, _ in chunk)
            ids = torch.zeros(len(chunk), n, dtype=torch.long)
            mask = torch.zeros(len(chunk), n, dtype=torch.long)
            for row, (s, _) in enumerate(chunk):
                ids[row, :len(s)] = torch.tensor(s)
                mask[row, :len(s)] = 1
            slots = torch.tensor([sl for _, sl in chunk]) if kind else None
            out.append((ids, mask, slots))
    return out


def loss_of(model, ids, mask, slots):
    """Token cross-entropy of every text token (a caption's first from the last slot)."""
    logits = model(ids, mask, slots)
    if slots is not None:
        logits = logits[:, SLOTS - 1:-1]
        targets = ids.masked_fill(mask == 0, -100)
    else:
        logits = logits[:, :-1]
        targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), ignore_index=-100)


def greedy(model, slots, stop, most=40):
    """Greedy caption from context slots [SLOTS][3] (compact ids)."""
    ids = []
    model.eval()
    with torch.no_grad():
        while len(ids) < most:
            t = torch.tensor([ids], dtype=torch.long)
            nxt = int(model(t, torch.ones_like(t), torch.tensor([slots]))[0, -1].argmax())
            if nxt >= model.decoder.embed_tokens.num_embeddings:
                break  # a zero row (any unused id) won: the full model would say that id
            ids.append(nxt)
            if nxt == stop:
                break
    model.train()
    return ids


def save(model, cfg_json, token_ids, out):
    os.makedirs(out, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.decoder.state_dict().items()
               if not k.endswith("rotary_emb.inv_freq")}
    tensors["token_ids"] = torch.tensor(token_ids, dtype=torch.int64)
    path = os.path.join(out, "compact.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), tensors


def significant(x):
    """`x` to 7 significant digits: the measures' precision in the manifest."""
    return float(f"{x:.7g}")


def measures(epoch_losses, last_loss, model, sample, tensors):
    """What the run made, as numbers that hold across CPUs to far better than the test's
    tolerance: the loss of every epoch and of the last step, the L2 norm of the compact logits
    over `sample` (ids, no context slots), and the L2 norm of every saved float tensor
    (`token_ids` is the used vocabulary, not a weight)."""
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([sample])
        logits = model(ids, torch.ones_like(ids))[0, :, :-1]
    return {
        "epoch_losses": [significant(v) for v in epoch_losses],
        "last_step_loss": significant(last_loss),
        "logits_norm": significant(logits.double().norm().item()),
        "tensor_norms": {k: significant(v.double().norm().item())
                         for k, v in sorted(tensors.items()) if v.is_floating_point()},
    }


def check_expanded(model, out, token_ids, sample):
    """scripts/demo/expand_lm.py's checkpoint, loaded by transformers, is the trained model: the
    same logits at the used ids and exactly 0 at every other id."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from expand_lm import expand
    with tempfile.TemporaryDirectory() as tmp:
        expand(out, tmp)
        full = Qwen2ForCausalLM.from_pretrained(tmp).eval()
        model.eval()
        with torch.no_grad():
            ids = torch.tensor([sample])
            compact = model(ids, torch.ones_like(ids))[0, :, :-1]
            logits = full(input_ids=torch.tensor([[token_ids[i] for i in sample]])).logits[0]
        used = torch.tensor(token_ids)
        rest = torch.ones(logits.shape[-1], dtype=torch.bool)
        rest[used] = False
        if not torch.allclose(logits[:, used], compact, atol=1e-4) or logits[:, rest].abs().max() != 0:
            raise SystemExit(f"{out}: the expanded checkpoint is not the trained model")


def full_config_json(args, end_of_text):
    """config.json of the expanded checkpoint, as tessera's init-model writes a Qwen2 LM."""
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB,
        "hidden_size": args.hidden, "intermediate_size": 2 * args.hidden,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "hidden_act": "silu",
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True, "use_sliding_window": False, "attention_dropout": 0.0,
        "bos_token_id": end_of_text, "eos_token_id": end_of_text, "torch_dtype": "float32",
    }


def recipe_args():
    """The command line less where it reads and writes: what make_demo_models.sh records."""
    out, skip = [], False
    for word in sys.argv[1:]:
        if skip:
            skip = False
        elif word in ("--out", "--work", "--tessera", "--tokenizer"):
            skip = True
        else:
            out.append(word)
    return out


def main():
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.reproducible:
        torch.use_deterministic_algorithms(True)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    end_of_text = tokenizer.token_to_id(END_OF_TEXT)
    work = args.work or args.out.rstrip("/") + ".records"
    t0 = time.time()
    raw = []  # (ids, slot word ids or None)
    for seed in args.seeds.split(","):
        for r in records(args.tessera, work, int(seed), args.records):
            if "image" in r:
                caption = r["conversations"][1]["value"]
                slots = slot_words(tokenizer, caption, rng)
                if slots is not None:
                    raw.append((caption_ids(tokenizer, caption), slots))
            else:
                raw.append((conversation_ids(tokenizer, r["conversations"]), None))
    shutil.rmtree(work, ignore_errors=True)
    token_ids = sorted({i for s, sl in raw for i in s} | {i for _, sl in raw if sl for w in sl for i in w if i >= 0})
    compact = {t: i for i, t in enumerate(token_ids)}
    samples = [([compact[i] for i in s], [[compact[i] if i >= 0 else -1 for i in w] for w in sl] if sl else None)
               for s, sl in raw]
    held = min(args.held_out, len(samples) // 5)
    train, test = (samples[:-held], samples[-held:]) if held else (samples, [])
    images = sum(sl is not None for _, sl in train)
    print(f"{len(train)} training records ({images} captions with context slots, "
          f"{len(train) - images} conversations; seeds {args.seeds}), {held} held out, "
          f"{len(token_ids)} distinct ids of {VOCAB}; {time.time() - t0:.0f}s", flush=True)

    model = CompactLm(config(args, len(token_ids)), VOCAB - len(token_ids), args.slot_noise)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(batches(train, args.batch, range(len(train))))
    total = max(steps_per_epoch * args.epochs, 1)
    warmup = max(total // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0)))))
    held_loss = None
    epoch_losses = []
    for epoch in range(args.epochs):
        losses = []
        order = torch.randperm(len(train)).tolist()
        plan = batches(train, args.batch, order)
        for b in torch.randperm(len(plan)).tolist():
            loss = loss_of(model, *plan[b])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())
        epoch_losses.append(float(np.mean(losses)))
        line = f"epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}"
        if test:
            model.eval()
            with torch.no_grad():
                held_loss = float(np.mean([loss_of(model, *b).item()
                                           for b in batches(test, 100, range(len(test)))]))
            model.train()
            line += f", held-out loss {held_loss:.4f}"
        print(f"{line} ({time.time() - t0:.0f}s)", flush=True)
    shown = next((s for s in (test or train) if s[1] is not None), None)
    if shown is not None:
        said = greedy(model, shown[1], compact[end_of_text])
        print("greedy from context:", repr(tokenizer.decode([token_ids[i] for i in said])),
              "| reference:", repr(tokenizer.decode([token_ids[i] for i in shown[0]])))
    last_loss = losses[-1] if args.epochs and losses else float("nan")
    digest, tensors = save(model, full_config_json(args, end_of_text), token_ids, args.out)
    check_expanded(model, args.out, token_ids, (test or train)[0][0])
    print(json.dumps({"sha256": digest, "args": recipe_args(), "used_ids": len(token_ids),
                      "held_out_loss": held_loss,
                      "measures": measures(epoch_losses, last_loss, model, train[0][0], tensors)}))


if __name__ == "__main__":
    sys.exit(main())
