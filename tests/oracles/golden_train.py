#!/usr/bin/env python3
"""Golden losses of full-parameter training for tessera's parity test
(trainer/train/tests/fsdp_vlm/golden_train.rs).

Loads the tiny checkpoints that tests/oracles/golden.py wrote under tests/fixtures/golden/ (the
SiglipVisionModel in vision/, the tied and the untied Qwen2ForCausalLM in lm_tied/ and lm_untied/,
the mlp2x_gelu projector in projector.safetensors) and trains a LLaVA-style model on CPU in f32
for STEPS optimizer steps of one micro-batch each, with transformers and PyTorch only:

  * the vision tower is frozen; its features are hidden_states[-2] (no post-LN) of the
    normalised pixels ((x / 255 - 0.5) / 0.5);
  * the projector and every LM parameter train (a tied embedding/head is one parameter);
  * the projected image tokens replace the placeholder embeddings, in row-major order;
  * labels are already shifted (labels[t] is the target at position t, -100 = not supervised);
    the loss of a step is the summed token cross-entropy over supervised labels divided by the
    number of supervised labels of the step (tessera's convention);
  * torch.optim.AdamW(lr=LR, betas=BETAS, eps=EPS) with weight decay WEIGHT_DECAY on parameters
    of two or more dimensions only (biases and RMSNorm weights get 0, as transformers' Trainer
    decides it), no gradient clipping, no schedule (constant lr).

The same micro-batches (drawn from fixed seeds) train the tied and the untied LM from the same
vision tower and projector. Each row is one image sample: 2 text tokens, the image's 16
placeholder tokens, a caption (from a small sub-vocabulary, so the losses drop visibly), then
padding (id 0, label -100, position 0) to the common row length. The last placeholder predicts
the first caption token; a few caption labels are -100.

Writes tests/fixtures/golden/train_full.safetensors:
  pixels_u8 [STEPS, ROWS, 3, 32, 32] (int64 holding 0..255), input_ids / labels / positions
  [STEPS, ROWS, LEN] int64, lengths [STEPS, ROWS] int64 (tokens before the padding),
  {tied,untied}_losses [STEPS] f32: the step's loss before its update,
  {tied,untied}_grad_norms [STEPS] f32: the global L2 norm of the trainable gradients,
  {tied,untied}_update_norm.<parameter> [1] f32: |final - initial| (L2) of every trained
    parameter after the STEPS updates, by its tessera / Hugging Face name (mm_projector.*,
    model.*, lm_head.weight when untied);
and tests/fixtures/golden/train_full.json with the hyper-parameters (lr, betas, eps,
weight_decay, max_grad_norm = null, image_token_id, steps).

Run by hand (not in CI), from the repository root, with the Python scripts/setup/setup.sh makes
(transformers 5.24 over .deps/venv's torch):
  .deps/hfvenv/bin/python tests/oracles/golden_train.py
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import Qwen2ForCausalLM, SiglipVisionModel

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "golden")
IMAGE_TOKEN_ID = 299
STEPS = 5
ROWS = 2
PREFIX = 2
CAPTION = (4, 10)  # caption lengths, inclusive
CAPTION_VOCAB = 24  # caption ids are drawn from 1..=CAPTION_VOCAB
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01


def batches(image_size, image_tokens, vocab):
    """STEPS micro-batches of ROWS image samples each, padded to one common row length."""
    gen = torch.Generator().manual_seed(1234)
    rows = []
    for _ in range(STEPS * ROWS):
        prefix = torch.randint(CAPTION_VOCAB + 1, vocab, (PREFIX,), generator=gen)
        prefix[prefix == IMAGE_TOKEN_ID] += 1
        n = int(torch.randint(CAPTION[0], CAPTION[1] + 1, (1,), generator=gen))
        caption = torch.randint(1, CAPTION_VOCAB + 1, (n,), generator=gen)
        ids = torch.cat([prefix, torch.full((image_tokens,), IMAGE_TOKEN_ID), caption])
        first_caption = PREFIX + image_tokens
        labels = torch.full_like(ids, -100)
        labels[first_caption - 1 : -1] = ids[first_caption:]
        # Leave a few targets unsupervised (never the first, so every row keeps one).
        drop = torch.rand(n, generator=gen) < 0.25
        drop[0] = False
        targets = labels[first_caption - 1 : -1]  # a view: n entries
        targets[drop] = -100
        pixels = torch.randint(0, 256, (3, image_size, image_size), generator=gen)
        rows.append((ids, labels, pixels))
    length = max(len(ids) for ids, _, _ in rows)
    input_ids = torch.zeros(STEPS * ROWS, length, dtype=torch.int64)
    labels = torch.full((STEPS * ROWS, length), -100, dtype=torch.int64)
    positions = torch.zeros(STEPS * ROWS, length, dtype=torch.int64)
    lengths = torch.zeros(STEPS * ROWS, dtype=torch.int64)
    for r, (ids, lab, _) in enumerate(rows):
        input_ids[r, : len(ids)] = ids
        labels[r, : len(ids)] = lab
        positions[r, : len(ids)] = torch.arange(len(ids))
        lengths[r] = len(ids)
    pixels = torch.stack([p for _, _, p in rows]).to(torch.int64)
    shape = (STEPS, ROWS)
    return {
        "pixels_u8": pixels.reshape(*shape, 3, image_size, image_size),
        "input_ids": input_ids.reshape(*shape, length),
        "labels": labels.reshape(*shape, length),
        "positions": positions.reshape(*shape, length),
        "lengths": lengths.reshape(shape),
    }


def image_features(vision, pixels_u8):
    """Frozen tower: hidden_states[-2] of the normalised pixels `[n, 3, s, s]`."""
    pixel_values = (pixels_u8.float() / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        out = vision(pixel_values=pixel_values, output_hidden_states=True)
    return out.hidden_states[-2]


def load_projector(vision_hidden, lm_hidden):
    projector = torch.nn.Sequential(
        torch.nn.Linear(vision_hidden, lm_hidden), torch.nn.GELU(), torch.nn.Linear(lm_hidden, lm_hidden)
    )
    state = load_file(os.path.join(GOLDEN, "projector.safetensors"))
    prefix = "mm_projector."
    projector.load_state_dict({k[len(prefix) :]: v for k, v in state.items()})
    return projector


def train(lm_name, data, features):
    """Trains projector + LM for STEPS steps: the losses before each update, the grad norms, and
    by parameter name the L2 norm of (final - initial) over all STEPS updates."""
    lm = Qwen2ForCausalLM.from_pretrained(
        os.path.join(GOLDEN, lm_name), attn_implementation="eager", dtype=torch.float32
    )
    lm.train()
    tied = lm.config.tie_word_embeddings
    assert (lm.lm_head.weight is lm.model.embed_tokens.weight) == tied, lm_name
    projector = load_projector(features.shape[-1], lm.config.hidden_size)
    # named_parameters() yields a shared (tied) tensor once, under model.embed_tokens.weight.
    named = [(f"mm_projector.{k}", p) for k, p in projector.named_parameters()]
    named += list(lm.named_parameters())
    params = [p for _, p in named]
    initial = {name: p.detach().clone() for name, p in named}
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
        eps=EPS,
        foreach=False,
    )
    losses, norms = [], []
    for step in range(STEPS):
        ids = data["input_ids"][step]
        labels = data["labels"][step]
        positions = data["positions"][step]
        image_tokens = projector(features[step].flatten(0, 1))  # [rows * tokens, D] row-major
        embeds = lm.get_input_embeddings()(ids)
        mask = (ids == IMAGE_TOKEN_ID).unsqueeze(-1).expand_as(embeds)
        assert int((ids == IMAGE_TOKEN_ID).sum()) == image_tokens.shape[0]
        embeds = embeds.masked_scatter(mask, image_tokens)
        # Padding sits at the end of each row, so causal attention keeps it away from every
        # real token: no attention mask is needed, and padding carries no label.
        logits = lm(inputs_embeds=embeds, position_ids=positions).logits
        supervised = int((labels != -100).sum())
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        loss = loss_sum / supervised
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None))
        optimizer.step()
        losses.append(loss.item())
        norms.append(norm.item())
        print(f"{lm_name} step {step + 1}: loss {loss.item():.7f} grad norm {norm.item():.6f}", file=sys.stderr)
    updates = {name: (p.detach() - initial[name]).norm().reshape(1) for name, p in named}
    return torch.tensor(losses, dtype=torch.float32), torch.tensor(norms, dtype=torch.float32), updates


def main():
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    vision = SiglipVisionModel.from_pretrained(
        os.path.join(GOLDEN, "vision"), attn_implementation="eager", dtype=torch.float32
    ).eval()
    vision.requires_grad_(False)
    cfg = vision.config
    image_tokens = (cfg.image_size // cfg.patch_size) ** 2
    with open(os.path.join(GOLDEN, "lm_tied", "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    data = batches(cfg.image_size, image_tokens, vocab)
    pixels = data["pixels_u8"].flatten(0, 1)
    features = image_features(vision, pixels).reshape(STEPS, ROWS, image_tokens, -1)

    out = dict(data)
    for name, lm_name in [("tied", "lm_tied"), ("untied", "lm_untied")]:
        losses, norms, updates = train(lm_name, data, features)
        out[f"{name}_losses"] = losses
        out[f"{name}_grad_norms"] = norms
        for param, norm in updates.items():
            out[f"{name}_update_norm.{param}"] = norm
    out = {k: v.contiguous() for k, v in out.items()}
    path = os.path.join(GOLDEN, "train_full.safetensors")
    save_file(out, path, metadata={"format": "pt"})
    hyper = {
        "lr": LR,
        "betas": list(BETAS),
        "eps": EPS,
        "weight_decay": WEIGHT_DECAY,
        "weight_decay_min_ndim": 2,
        "max_grad_norm": None,
        "image_token_id": IMAGE_TOKEN_ID,
        "steps": STEPS,
        "rows": ROWS,
    }
    with open(os.path.join(GOLDEN, "train_full.json"), "w") as f:
        json.dump(hyper, f, indent=2)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path) / 1e3:.1f} kB) and train_full.json", file=sys.stderr)


if __name__ == "__main__":
    main()
