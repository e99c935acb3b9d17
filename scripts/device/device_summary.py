#!/usr/bin/env python3
"""Figures of one scripts/device/device_round.sh call, from its work folder: per tessera run real
tokens/s, images/s, ms/step, model TFLOP/s and MFU, peak device memory (nvidia-smi samples), the
loader's wait and the per-unit times; the transformers steps beside them and the ratios; the
tiny preset's cuda-vs-cpu losses; the loader bench; what each switch is worth.

usage: device_summary.py WORK VISION_DIR LM_DIR FIRST_TIMED_STEP DEVICE
Model FLOPs count each step once without recomputation: the frozen vision tower forward only,
a frozen LM forward + input gradients (2x its forward), a trained one 3x, attention causal
within each sample, the projector trained (3x), LoRA adapters 3x their forward.
"""
import json
import os
import re
import statistics as st
import sys

NOMINAL = 989e12  # H100 / H200 SXM dense bf16, the spec sheet's figure without sparsity


def load_json(path):
    cfg = json.load(open(path))
    return cfg.get("vision_config", cfg)


def model_flops(vc, lc, images, tokens, supervised, lm_trained=False, lora_r=0):
    d, ff, layers = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"] - 1
    side, patch = vc["image_size"], vc["patch_size"]
    ntok = (side // patch) ** 2
    vis = ntok * (2 * 3 * patch * patch * d + layers * 2 * (4 * d * d + 2 * d * ff)) \
        + layers * 4 * ntok * ntok * d
    h, f, n_layers = lc["hidden_size"], lc["intermediate_size"], lc["num_hidden_layers"]
    heads = lc["num_attention_heads"]
    hd = lc.get("head_dim") or h // heads
    kv = lc.get("num_key_value_heads", heads) * hd
    q = heads * hd
    per_tok = n_layers * 2 * (h * (q + 2 * kv) + q * h + 3 * h * f)
    seq = tokens / max(images, 1)
    attn = n_layers * 2 * q * seq * tokens  # qk and pv over half the square, per sample
    proj = images * ntok * 2 * (d * h + h * h)
    head = supervised * 2 * h * lc["vocab_size"]
    lora = 0
    if lora_r:
        per_layer = (h + q) + (h + kv) * 2 + (q + h) + (h + f) * 2 + (f + h)
        lora = tokens * n_layers * 2 * lora_r * per_layer
    lm_mult = 3 if lm_trained else 2
    return images * vis + lm_mult * (tokens * per_tok + head) + 3 * attn + 3 * proj + 3 * lora


def metrics(work, run):
    p = os.path.join(work, run, "metrics.jsonl")
    return [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []


def gpu_peak(work, tag):
    p = os.path.join(work, tag + ".gpumem")
    vals = [int(x) for x in open(p).read().split() if x.isdigit()] if os.path.exists(p) else []
    return max(vals) if vals else None


def main():
    work, vision_dir, lm_dir, first, device = sys.argv[1:6]
    first = int(first)
    vc = load_json(os.path.join(vision_dir, "config.json"))
    lc = load_json(os.path.join(lm_dir, "config.json"))
    peak = 0.0
    if os.path.exists(os.path.join(work, "peak.log")):
        m = re.search(r"PEAK ([\d.e+]+)", open(os.path.join(work, "peak.log")).read())
        peak = float(m.group(1)) if m else 0.0
    print(f"same-run matmul peak: {peak / 1e12:.1f} TFLOP/s" if peak else "matmul peak: not measured")

    def mfu_text(flops_per_s):
        s = f"{flops_per_s / 1e12:.1f} model TFLOP/s"
        if device == "cuda":
            s += f", MFU {flops_per_s / NOMINAL:.1%} of 989"
        if peak:
            s += f", {flops_per_s / peak:.1%} of the measured peak"
        return s

    rates = {}
    runs = [("s1", "stage 1", {}), ("s2_lora", "stage 2 LoRA r 64", {"lora_r": 64}),
            ("s2_full", "stage 2 full (projector,lm)", {"lm_trained": True}),
            ("v_dense", "stage 1, TESSERA_DENSE_ATTENTION=1", {}),
            ("v_noside", "stage 1, TESSERA_SIDE_STREAM=0", {}),
            ("v_norecompute", "stage 1, --recompute none", {}),
            ("v_selective", "stage 1, --recompute selective", {}),
            ("v_every2", "stage 1, --recompute every:2", {}),
            ("v_recompute_all", "stage 1, --recompute all", {})]
    for run, label, kw in runs:
        all_steps = metrics(work, run)
        m = all_steps[first:]
        if not m:
            print(f"{label}: no metrics")
            continue
        secs = sum(x["step_time_s"] for x in m)
        tok = sum(x["real_tokens"] for x in m) / secs
        img = sum(x["images"] for x in m) / secs
        flops = sum(model_flops(vc, lc, x["images"], x["real_tokens"], x["supervised_tokens"], **kw)
                    for x in m) / secs
        wait = st.mean(x["loader_wait_frac"] for x in m)
        rates[run] = tok
        mem = gpu_peak(work, run)
        print(f"tessera {label}: {tok:,.0f} real tokens/s, {img:,.1f} images/s, "
              f"{secs / len(m) * 1000:.0f} ms/step (steps {m[0]['step']}-{m[-1]['step']}), "
              f"{mfu_text(flops)}, loader wait {wait:.2%}"
              + (f", peak device memory {mem:,} MiB" if mem is not None else ""))
        units = {}
        for x in m:
            for k, v in x.get("unit_time_s", {}).items():
                units.setdefault(k, []).append(v)
        if units:
            print("  per-step median unit times: " + ", ".join(
                f"{k} {st.median(v) * 1000:.0f} ms" for k, v in sorted(units.items())))
        print("  losses: " + " ".join("%.4f" % x["loss"] for x in all_steps[::3]))
    for run in ("v_dense", "v_noside", "v_norecompute", "v_selective", "v_every2", "v_recompute_all"):
        if run in rates and "s1" in rates:
            print(f"SWITCH {run}: {rates[run] / rates['s1']:.2f}x the default stage-1 rate")
    for run in ("s1", "v_norecompute", "v_selective", "v_every2", "v_recompute_all"):
        p = os.path.join(work, run + ".recompute.json")
        if os.path.exists(p):
            r = json.load(open(p))
            est = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in r["estimated_peak_bytes"])
            mem = gpu_peak(work, run)
            print(f"RECOMPUTE {run}: ran {r['choice']} ({r['how']}); estimated peak GiB: {est}"
                  + (f"; measured peak device memory {mem:,} MiB" if mem is not None else ""))

    for tag, label, ours in (("hf_s1", "stage 1", "s1"), ("hf_full", "full-parameter (--train lm)", "s2_full")):
        p = os.path.join(work, tag + ".log")
        if not os.path.exists(p):
            continue
        text = open(p).read()
        times = [float(t) for i, t in re.findall(r"^step (\d+): ([\d.]+)s", text, re.M) if int(i) > 0]
        args = re.search(r"(\d+) images x \d+ tokens, row of (\d+) tokens, (\d+) supervised", text)
        if not (times and args):
            print(f"transformers {label}: no step times in {p}")
            continue
        images, tokens, supervised = (int(g) for g in args.groups())
        secs = st.median(times)
        flops = model_flops(vc, lc, images, tokens, supervised, lm_trained=tag == "hf_full") / secs
        mem = gpu_peak(work, tag)
        hf_tok = tokens / secs
        print(f"transformers {label}: {hf_tok:,.0f} tokens/s ({secs * 1000:.0f} ms/step median of "
              f"{len(times)}), {mfu_text(flops)}"
              + (f", peak device memory {mem:,} MiB" if mem else ""))
        if ours in rates:
            print(f"RATIO tessera/transformers {label}: {rates[ours] / hf_tok:.2f} "
                  f"(tessera {rates[ours]:,.0f}, transformers {hf_tok:,.0f} tokens/s)")

    gpu, cpu = metrics(work, "tiny_cuda"), metrics(work, "tiny_cpu")
    if gpu and cpu:
        rel = [abs(g["loss"] - c["loss"]) / abs(c["loss"]) for g, c in zip(gpu, cpu)]
        print(f"tiny preset, cuda bf16 vs cpu f32 over {len(rel)} steps: max relative loss "
              f"difference {max(rel):.2%}, last step {rel[-1]:.2%} "
              f"(cpu {cpu[-1]['loss']:.4f}, cuda {gpu[-1]['loss']:.4f})")
        print("  cpu:  " + " ".join("%.4f" % x["loss"] for x in cpu[::5]))
        print("  cuda: " + " ".join("%.4f" % x["loss"] for x in gpu[::5]))
    launch = metrics(work, "tiny_launch")
    if launch and gpu:
        print(f"--nproc 1 (launcher, one-rank NCCL group) step 0 loss {launch[0]['loss']:.6f} vs "
              f"single process {gpu[0]['loss']:.6f}")

    for threads in (8, 16):
        p = os.path.join(work, f"loader_{threads}.log")
        if not os.path.exists(p):
            continue
        lines = [l for l in open(p).read().splitlines() if l.startswith("{")]
        if not lines:
            print(f"loader {threads} threads: no JSON line")
            continue
        r = json.loads(lines[-1])
        ref = r.get("reference_images_per_s")
        ratio = r.get("ratio_vs_reference")
        print(f"loader {threads} threads: {r['images_per_s']:,.0f} images/s, PIL reference "
              f"{ref if ref is None else f'{ref:,.0f}'} images/s, ratio "
              f"{ratio if ratio is None else f'{ratio:.1f}'}x")


if __name__ == "__main__":
    main()
