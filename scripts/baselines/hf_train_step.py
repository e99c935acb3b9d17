#!/usr/bin/env python3
"""transformers baseline for tessera's training step: the LLaVA step a user would run instead,
PyTorch eager + transformers, timed per optimizer step on the same work tessera does.

Measures: wall seconds per step (forward + backward + gradient clipping + AdamW) and the loss,
for one packed row of TOKENS tokens holding IMAGES images (729 tokens each for so400m-384) and
SUPERVISED supervised tokens, plus peak RSS. The model is the LLaVA composition:
  * SiglipVisionModel (from a SigLIP or SiglipVision checkpoint); its last encoder layer is
    dropped and the features are the remaining encoder's last hidden states, i.e. the layer
    before the last without post-layernorm, as LLaVA's `mm_vision_select_layer -2` and tessera
    do (--keep-last-layer runs every layer and takes hidden_states[-2] instead: same features,
    one layer more work);
  * mlp2x_gelu projector: Linear(vision hidden, lm hidden) -> exact GELU -> Linear, f32 weights;
  * the LM as AutoModelForCausalLM loads it (any transformers causal LM: Qwen2, Qwen3,
    Llama/SmolLM2, Qwen3-MoE with its default experts kernel and its router balance loss,
    router_aux_loss_coef x load_balancing_loss_func, added as its own forward adds it), SDPA
    attention; projected image features replace the embeddings of
    the row's positions 1..IMAGES*729; the loss is cross-entropy of the LM head on the
    SUPERVISED positions before the last only (--full-logits: HF's own labels path, logits for
    every position).
Trainable sets: the projector always; --train lm and/or vision trains those towers in full
(LLaVA-1.5 stage 2 style). Precision: --dtype float32, or bfloat16 = frozen towers stored in
bf16, trained parameters f32 masters, forward under torch.autocast(bfloat16). Optimizer: AdamW
(lr 1e-3 projector-only, 2e-5 when a tower trains; no weight decay), grad-norm clip 1.0.
Inputs are random and seeded (seed 0): token ids and targets below min(151000, the LM's
vocab_size), pixels N(0, 1)
drawn fresh each step (outside the timed region); weights come from the checkpoints given.
With the same checkpoints and arguments two runs see the same projector init and inputs.

Run (Python with torch and transformers, e.g. .deps/hfvenv/bin/python):
  hf_train_step.py VISION_DIR LM_DIR --images N --tokens T --supervised K [--steps 3]
      [--dtype float32|bfloat16] [--device cpu|cuda] [--threads 2] [--train lm|lm,vision]
      [--ckpt] [--full-logits] [--keep-last-layer]
Give it the images / tokens / supervised tokens per step of the tessera run it is compared with
(medians from that run's metrics.jsonl); scripts/bench/cpu_vs_hf.sh and scripts/device/device_bench.sh do.

Prints (the lines those scripts parse):
  load <s>s; <N> images x <n> tokens, row of <T> tokens, <K> supervised
  step <i>: <seconds>s (vision fwd ..., proj+lm fwd ..., bwd+opt ...; cpu ...s) loss <loss>
  BASELINE mean s/step <all> (all), <rest> (excl. first); maxrss <MiB> MiB[; peak cuda ...]
"""
import argparse
import resource
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, SiglipVisionModel

VOCAB_DRAW = 151000  # token ids and targets are drawn below this and the LM's vocab_size


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vision", help="SigLIP checkpoint folder (config.json + safetensors)")
    ap.add_argument("lm", help="causal LM checkpoint folder (Qwen2, Qwen3, Llama, ...)")
    ap.add_argument("--images", type=int, required=True, help="images in the row")
    ap.add_argument("--tokens", type=int, required=True, help="row length, image tokens included")
    ap.add_argument("--supervised", type=int, required=True, help="positions with a loss")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps (the first is warm-up)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--train", default="", help="towers trained in full besides the projector: lm, vision or lm,vision")
    ap.add_argument("--ckpt", action="store_true", help="gradient checkpointing in the LM")
    ap.add_argument("--full-logits", action="store_true", help="LM head on every position (HF labels path)")
    ap.add_argument("--keep-last-layer", action="store_true", help="run every vision layer, take hidden_states[-2]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.train = {t for t in args.train.split(",") if t}
    if not args.train <= {"lm", "vision"}:
        ap.error(f"--train takes lm and/or vision, not {','.join(sorted(args.train))}")
    return args


def report_load(name, info):
    missing, unexpected = info["missing_keys"], info["unexpected_keys"]
    print(f"{name} load: {len(missing)} missing {sorted(missing)[:5]}, {len(unexpected)} unexpected, "
          f"{len(info['mismatched_keys'])} mismatched", flush=True)


def load_towers(args, compute_dtype):
    """Vision tower and LM on the device; a trained tower keeps f32 weights (its masters)."""
    vision_dtype = torch.float32 if "vision" in args.train else compute_dtype
    lm_dtype = torch.float32 if "lm" in args.train else compute_dtype
    vision, info = SiglipVisionModel.from_pretrained(args.vision, dtype=vision_dtype, output_loading_info=True)
    report_load("vision", info)
    if not args.keep_last_layer:
        encoder = getattr(vision, "vision_model", vision).encoder
        encoder.layers = encoder.layers[:-1]  # its output is never used
    lm, info = AutoModelForCausalLM.from_pretrained(args.lm, dtype=lm_dtype, attn_implementation="sdpa",
                                                    output_loading_info=True)
    report_load("lm", info)
    vision.to(args.device).eval()
    lm.to(args.device)
    vision.requires_grad_("vision" in args.train)
    lm.requires_grad_("lm" in args.train)
    if args.ckpt:
        lm.gradient_checkpointing_enable()
        lm.train()  # HF checkpoints only in training mode (attention dropout is 0)
    else:
        lm.eval()
    return vision, vision_dtype, lm


def mlp2x_gelu(vision_hidden, lm_hidden):
    return nn.Sequential(nn.Linear(vision_hidden, lm_hidden), nn.GELU(), nn.Linear(lm_hidden, lm_hidden))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = args.device
    compute_dtype = getattr(torch, args.dtype)
    on_cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)

    t_load = time.perf_counter()
    vision, pixel_dtype, lm = load_towers(args, compute_dtype)
    side = vision.config.image_size
    per_image = (side // vision.config.patch_size) ** 2
    hidden = lm.config.hidden_size
    projector = mlp2x_gelu(vision.config.hidden_size, hidden).to(dev)  # f32 in every mode
    params = list(projector.parameters())
    params += [p for tower in (vision, lm) for p in tower.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-5 if args.train else 1e-3, weight_decay=0.0)
    print(f"trainable parameters: {sum(p.numel() for p in params):,}", flush=True)

    n_image_tokens = args.images * per_image
    if n_image_tokens + args.supervised > args.tokens:
        raise SystemExit(f"{args.images} images x {per_image} tokens + {args.supervised} supervised "
                         f"do not fit a row of {args.tokens} tokens")
    # One fixed row: images right after the first token, supervision at the end of the row.
    vocab = min(VOCAB_DRAW, lm.config.vocab_size)
    ids = torch.randint(0, vocab, (1, args.tokens), device=dev)
    image_pos = 1 + torch.arange(n_image_tokens, device=dev)
    loss_pos = torch.arange(args.tokens - 1 - args.supervised, args.tokens - 1, device=dev)
    targets = torch.randint(0, vocab, (args.supervised,), device=dev)  # the token after each
    print(f"load {time.perf_counter() - t_load:.1f}s; {args.images} images x {per_image} tokens, "
          f"row of {args.tokens} tokens, {args.supervised} supervised", flush=True)

    mixed = compute_dtype == torch.bfloat16
    moe = getattr(lm.config, "num_experts", 0) or 0
    if moe:
        # An MoE LM (qwen3_moe): its router balance loss joins the loss as transformers' own
        # forward adds it (output_router_logits), with the config's coefficient.
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        def moe_balance(router_logits):
            aux = load_balancing_loss_func(router_logits, moe, lm.config.num_experts_per_tok)
            return lm.config.router_aux_loss_coef * aux
        if args.full_logits:
            raise SystemExit("--full-logits leaves out an MoE LM's balance loss")
    step_times = []
    for step in range(args.steps):
        pixels = torch.randn(args.images, 3, side, side, dtype=pixel_dtype, device=dev)
        sync()
        t0, cpu0 = time.perf_counter(), time.process_time()
        with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16, enabled=mixed):
            with torch.set_grad_enabled("vision" in args.train):
                states = vision(pixel_values=pixels, output_hidden_states=True).hidden_states
                features = states[-2] if args.keep_last_layer else states[-1]
            sync()
            t_vision = time.perf_counter()
            image_embeds = projector(features).reshape(n_image_tokens, hidden)
            embeds = lm.get_input_embeddings()(ids)[0]
            embeds = embeds.index_copy(0, image_pos, image_embeds.to(embeds.dtype)).unsqueeze(0)
            if args.full_logits:
                labels = torch.full_like(ids, -100)
                labels[0, loss_pos + 1] = targets  # HF shifts: logits at p predict labels at p + 1
                loss = lm(inputs_embeds=embeds, labels=labels, use_cache=False).loss
            else:
                out = lm.model(inputs_embeds=embeds, use_cache=False,
                               **({"output_router_logits": True} if moe else {}))
                last = out.last_hidden_state[0]
                loss = F.cross_entropy(lm.lm_head(last[loss_pos]), targets)
                if moe:
                    loss = loss + moe_balance(out.router_logits)
        sync()
        t_forward = time.perf_counter()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        t_end = time.perf_counter()
        step_times.append(t_end - t0)
        print(f"step {step}: {t_end - t0:.4f}s (vision fwd {t_vision - t0:.3f}, proj+lm fwd "
              f"{t_forward - t_vision:.3f}, bwd+opt {t_end - t_forward:.3f}; cpu "
              f"{time.process_time() - cpu0:.1f}s) loss {loss.item():.4f}", flush=True)

    rest = step_times[1:] or step_times
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    last = (f"BASELINE mean s/step {sum(step_times) / len(step_times):.4f} (all), "
            f"{sum(rest) / len(rest):.4f} (excl. first); maxrss {rss_mib:.0f} MiB")
    if on_cuda:
        last += f"; peak cuda memory {torch.cuda.max_memory_allocated(dev) / 2**20:.0f} MiB"
    print(last)


if __name__ == "__main__":
    main()
