#!/usr/bin/env python3
"""Pretrains the demo's tiny language model on caption text only (no images): a Qwen2 decoder
with Qwen's 151,936-token vocabulary that has learnt how a synth caption reads ("a large red
circle above a small blue square on a grey background") but has never seen a picture, so the
demo's stage 1 must teach it to look.

Text: the captions `tessera synth --text-only-fraction 0` writes with the seeds of --seeds
(default 200, 201; the demo's are 0 and 1, tests/demo_parts.rs checks), tokenized as tessera's
`plain` template tokenizes them after the image: caption, "\n", <|endoftext|>, every token
supervised. The last --held-out captions are scored at the end.

Compact vocabulary: captions use a few dozen of the 151,936 ids. The model trains only those
embedding rows (tied: they are the output head too) and keeps every other row at exactly 0,
so each unused id has logit 0; the softmax over the full vocabulary is computed exactly as the
compact logits plus one logit log(151,936 - used) standing for all the zero rows. The saved
`compact.safetensors` holds the used rows (`model.embed_tokens.weight`, `[used, hidden]`) and
their ids (`token_ids`); scripts/expand_lm.py writes the full `Qwen2ForCausalLM` checkpoint
(zeros elsewhere) that tessera and transformers load, the same model bit for bit.

Usage (the Python of scripts/setup.sh's .deps/hfvenv):
  .deps/hfvenv/bin/python scripts/pretrain_lm.py --out DIR [--captions N] [--epochs E] ...
  --reproducible: one thread and libtorch's portable kernels (see pretrain_tower.py).
Prints the loss per epoch, held-out loss and greedy samples, and the sha256 of the file.
"""
import argparse
import os
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for config.json + compact.safetensors")
    p.add_argument("--work", help="folder for the synth records (default OUT.captions, removed)")
    p.add_argument("--tessera", default="target/release/tessera")
    p.add_argument("--tokenizer", default=".deps/tokenizer/tokenizer.json")
    p.add_argument("--seeds", default="200,201", help="synth seeds, comma-separated")
    p.add_argument("--captions", type=int, default=8000, help="captions per seed")
    p.add_argument("--held-out", type=int, default=500)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="torch's seed (init, order)")
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
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Qwen2Config, Qwen2Model  # noqa: E402

VOCAB = 151_936  # Qwen2.5's embedding rows
END_OF_TEXT = "<|endoftext|>"
IMAGE_PAD = "<|image_pad|>"


def captions(tessera, work, seed, count):
    folder = os.path.join(work, f"seed-{seed}")
    subprocess.run([tessera, "synth", "--quiet", "--out", folder, "--samples", str(count),
                    "--text-only-fraction", "0", "--seed", str(seed)], check=True)
    with open(os.path.join(folder, "blip_laion_cc_sbu_558k.json")) as f:
        records = json.load(f)
    shutil.rmtree(folder)
    return [r["conversations"][1]["value"] for r in records]


def tokenize(tokenizer, caption):
    """The ids tessera's `plain` template gives the caption of an image sample, after the
    image: ingest tokenizes `<|image_pad|>caption\\n<|endoftext|>` as one string."""
    ids = tokenizer.encode(f"{IMAGE_PAD}{caption}\n{END_OF_TEXT}", add_special_tokens=False).ids
    if ids[0] != tokenizer.token_to_id(IMAGE_PAD):
        raise ValueError(f"{caption!r}: the image placeholder did not come first")
    return ids[1:]


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

    def __init__(self, cfg, unused):
        super().__init__()
        self.decoder = Qwen2Model(cfg)
        torch.nn.init.normal_(self.decoder.embed_tokens.weight, std=2.0 / math.sqrt(cfg.hidden_size))
        self.zero_rows = math.log(unused)

    def forward(self, ids, mask):
        h = self.decoder(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = h @ self.decoder.embed_tokens.weight.T
        rest = torch.full_like(logits[..., :1], self.zero_rows)
        return torch.cat([logits, rest], -1)


def batches(seqs, size, order):
    for start in range(0, len(order) - size + 1, size):
        chunk = [seqs[i] for i in order[start:start + size]]
        n = max(len(s) for s in chunk)
        ids = torch.zeros(len(chunk), n, dtype=torch.long)
        mask = torch.zeros(len(chunk), n, dtype=torch.long)
        for row, s in enumerate(chunk):
            ids[row, :len(s)] = torch.tensor(s)
            mask[row, :len(s)] = 1
        yield ids, mask


def loss_of(model, ids, mask):
    logits = model(ids, mask)[:, :-1]
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1), ignore_index=-100)


def greedy(model, start, stop, most=40):
    ids = [start]
    with torch.no_grad():
        while len(ids) < most:
            t = torch.tensor([ids])
            nxt = int(model(t, torch.ones_like(t))[0, -1].argmax())
            if nxt >= model.decoder.embed_tokens.num_embeddings:
                break  # a zero row (any unused id) won: the full model would say that id
            ids.append(nxt)
            if nxt == stop:
                break
    return ids


def save(model, cfg_json, token_ids, out):
    os.makedirs(out, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.decoder.state_dict().items()
               if not k.endswith("rotary_emb.inv_freq")}
    tensors = {f"model.{k}": v for k, v in tensors.items()}
    tensors["token_ids"] = torch.tensor(token_ids, dtype=torch.int64)
    path = os.path.join(out, "compact.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_expanded(model, out, token_ids, sample):
    """scripts/expand_lm.py's checkpoint, loaded by transformers, is the trained model: the
    same logits at the used ids and exactly 0 at every other id."""
    import tempfile
    from transformers import Qwen2ForCausalLM
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
    """The command line less where it writes: what makes_demo_models.sh records."""
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
    if args.reproducible:
        torch.use_deterministic_algorithms(True)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    end_of_text = tokenizer.token_to_id(END_OF_TEXT)
    work = args.work or args.out.rstrip("/") + ".captions"
    t0 = time.time()
    texts = [c for s in args.seeds.split(",") for c in captions(args.tessera, work, int(s), args.captions)]
    shutil.rmtree(work, ignore_errors=True)
    full = [tokenize(tokenizer, c) for c in texts]
    token_ids = sorted({i for s in full for i in s})
    compact = {t: i for i, t in enumerate(token_ids)}
    seqs = [[compact[i] for i in s] for s in full]
    held = min(args.held_out, len(seqs) // 5)
    train, test = (seqs[:-held], seqs[-held:]) if held else (seqs, [])
    print(f"{len(train)} training captions (seeds {args.seeds}), {held} held out, "
          f"{len(token_ids)} distinct ids of {VOCAB}; {time.time() - t0:.0f}s", flush=True)

    model = CompactLm(config(args, len(token_ids)), VOCAB - len(token_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(train) // args.batch
    total = max(steps_per_epoch * args.epochs, 1)
    warmup = max(total // 20, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0)))))
    held_loss = None
    for epoch in range(args.epochs):
        losses = []
        for ids, mask in batches(train, args.batch, torch.randperm(len(train)).tolist()):
            loss = loss_of(model, ids, mask)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.item())
        line = f"epoch {epoch + 1}/{args.epochs}: loss {np.mean(losses):.4f}"
        if test:
            with torch.no_grad():
                held_loss = float(np.mean([loss_of(model, i, m).item()
                                     for i, m in batches(test, min(100, len(test)), list(range(len(test))))]))
            line += f", held-out loss {held_loss:.4f}"
        print(f"{line} ({time.time() - t0:.0f}s)", flush=True)
    sample = greedy(model, compact[tokenizer.encode("a", add_special_tokens=False).ids[0]],
                    compact[end_of_text])
    print("greedy from 'a':", repr(tokenizer.decode([token_ids[i] for i in sample])))
    digest = save(model, full_config_json(args, end_of_text), token_ids, args.out)
    check_expanded(model, args.out, token_ids, (test or train)[0])
    print(json.dumps({"sha256": digest, "args": recipe_args(), "used_ids": len(token_ids),
                      "held_out_loss": held_loss}))


if __name__ == "__main__":
    sys.exit(main())
