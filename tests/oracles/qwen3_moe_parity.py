#!/usr/bin/env python3
"""Tiny random Qwen3-MoE checkpoints, written by transformers itself, and what it computes on them.

Usage: .deps/hfvenv/bin/python tests/oracles/qwen3_moe_parity.py OUT [VARIANT ...]

VARIANT (all of them when none is named) is one of
  top2-norm   3 layers (layer 1 dense through mlp_only_layers), 4 experts, top-2,
              norm_topk_prob, untied head
  top1        2 layers (decoder_sparse_step 2: layer 0 dense), 4 experts, top-1, tied
  top3-raw    2 sparse layers, 6 experts, top-3 without renormalisation, untied

Writes OUT/VARIANT/model/ (save_pretrained: the Hub's per-expert layout) and
OUT/VARIANT/outputs.safetensors with input_ids / positions [2,12] (the second row starting at
position 3), labels (already shifted, -100 where not supervised, as tessera's MicroBatch holds
them), logits [2,12,V], ce_loss (transformers' mean token loss), aux_loss
(load_balancing_loss_func over every sparse layer), loss (ce_loss + router_aux_loss_coef *
aux_loss: output_router_logits is on), and `grad.KEY` for every parameter: the gradient of
`loss`, with the experts' gradients split back into the per-expert keys the checkpoint uses.
The experts run transformers' eager kernel. router_aux_loss_coef is 0.05 (not 0.001) so that
the balance loss's share of the gradients is far above the tolerance.
trainer/model/tests/model/moe.rs checks tessera's numbers against these (f32, within 1e-4).
"""
import os
import sys

import torch
from safetensors.torch import save_file

VOCAB = 512
SEQ = 12

VARIANTS = {
    "top2-norm": dict(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False),
    "top1": dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=1,
                 norm_topk_prob=False, decoder_sparse_step=2, tie_word_embeddings=True),
    "top3-raw": dict(num_hidden_layers=2, num_experts=6, num_experts_per_tok=3,
                     norm_topk_prob=False, tie_word_embeddings=False),
}


def model_of(variant):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=80, moe_intermediate_size=40,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        router_aux_loss_coef=0.05, output_router_logits=True,
        attn_implementation="eager", experts_implementation="eager", **VARIANTS[variant],
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def per_expert(name, grad):
    """The gradient of a fused experts tensor under the checkpoint's per-expert keys."""
    prefix = name[: -len("gate_up_proj")] if name.endswith("gate_up_proj") else name[: -len("down_proj")]
    out = {}
    for e in range(grad.shape[0]):
        if name.endswith("gate_up_proj"):
            gate, up = grad[e].chunk(2, dim=0)
            out[f"{prefix}{e}.gate_proj.weight"] = gate
            out[f"{prefix}{e}.up_proj.weight"] = up
        else:
            out[f"{prefix}{e}.down_proj.weight"] = grad[e]
    return out


def run(out, variant):
    model = model_of(variant)
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    gen = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, VOCAB, (2, SEQ), generator=gen)
    positions = torch.stack([torch.arange(SEQ), torch.arange(3, 3 + SEQ)])
    labels = input_ids.clone()
    labels[0, :4] = -100
    labels[1, 5:8] = -100
    result = model(input_ids=input_ids, position_ids=positions, labels=labels)
    result.loss.backward()
    outputs = {
        "input_ids": input_ids,
        "positions": positions,
        "labels": torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1),
        "logits": result.logits.detach(),
        "loss": result.loss.detach().reshape(1),
        "aux_loss": result.aux_loss.detach().reshape(1),
        "ce_loss": (result.loss - model.config.router_aux_loss_coef * result.aux_loss).detach().reshape(1),
    }
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if ".mlp.experts." in name:
            grads = per_expert(name, p.grad)
        else:
            grads = {name: p.grad}
        outputs.update({f"grad.{k}": v for k, v in grads.items()})
    return outputs


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root, variants = sys.argv[1], sys.argv[2:] or list(VARIANTS)
    torch.use_deterministic_algorithms(True)
    for variant in variants:
        if variant not in VARIANTS:
            sys.exit(f"unknown variant {variant!r}\n\n{__doc__}")
        out = os.path.join(root, variant)
        os.makedirs(out, exist_ok=True)
        outputs = {k: v.contiguous() for k, v in run(out, variant).items()}
        save_file(outputs, os.path.join(out, "outputs.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main()
