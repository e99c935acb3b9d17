#!/usr/bin/env bash
# GPU benchmark of issue 12, in ONE call of a few minutes on a lent GPU machine: tessera stage 1
# and stage 2 (LoRA r 64) on the real shapes (google/siglip-so400m-patch14-384 +
# Qwen/Qwen2.5-0.5B, random weights, bf16 safetensors as the Hub ships them) at a token budget
# of 16,384, steps 5-25 timed: real tokens/s, images/s, peak GPU memory, MFU; then, in the same
# run on the same GPU, the baseline a user would pick instead (scripts/baselines/hf_train_step.py
# --device cuda --dtype bfloat16: PyTorch eager + transformers) given the same images, tokens and
# supervised tokens per step, and the ratio.
#
# The device gets the working tree plus at most 64 MiB of carried ignored files and cannot
# download anything; its python3 has torch + transformers. So the checkpoints (2.2 GB) are
# written there by scripts/baselines/make_hub_shaped_models.py (the baselines travel with the
# working tree), and DIR carries the rest. Prepare DIR here:
#   # CUDA_HOME/include: headers only, from PyPI (what worked on 2026-11-26, torch 2.11 / CUDA 13.0):
#   #   pip download --no-deps -d whl nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
#   #     nvidia-cuda-cccl==13.0.85 nvidia-nccl-cu13==2.28.9 nvidia-cublas==13.1.0.3 \
#   #     nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66
#   #   unzip each wheel; merge their nvidia/*/include folders into $CUDA_HOME/include
#   export LIBTORCH=$PWD/.deps/libtorch CUDA_HOME=/path/with/cuda+nccl/include  # trainer/sys/build.rs
#   cargo build --release --features cuda
#   mkdir -p data/device && cp target/release/tessera data/device/ && strip data/device/tessera
#   cp .deps/tokenizer/tokenizer.json data/device/
#   du -sh data/device     # stripped: 26 MiB for the CPU build here; with the tree, keep < 64 MiB
# Run (device tool): command "bash scripts/device/device_bench.sh data/device", carry ["data/device"],
# timeout_s 600. The summary and metrics come back under $OUT (default /tmp/device_bench_out).
#
# Dry run on a CPU (everything but CUDA): DEVICE=cpu bash scripts/device/device_bench.sh DIR, with DIR
# holding a CPU build of `tessera` (or a link to target/release/tessera) and tokenizer.json.
# It trains the tiny preset (budget 512, steps 2-5 timed) and runs the baseline on the CPU in
# f32; PY=path/to/python with torch + transformers (default python3).
# Knobs: STEPS (26 on cuda: steps 0-25), FROM (first timed step: 5), BUDGET (16384), SAMPLES
# (1200), PRECISION (bf16 on cuda, passed as --precision when the binary has the flag),
# LORA_R (64), HUB=path (reuse checkpoints already written), TESSERA_DENSE_ATTENTION=1 (dense
# mask instead of the varlen kernels, to compare), BENCH=dir (where the baseline scripts are:
# default scripts/baselines, the repo's own; a folder with the older name hf_reference_step.py,
# e.g. a carried copy of ../shared/bench, works too).
set -uo pipefail
DIR="$(cd "${1:?usage: device_bench.sh DIR}" && pwd)"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-/tmp/device_bench_out}"
W="${WORK:-/tmp/tessera_device_bench}"
PY="${PY:-python3}"
T="$DIR/tessera"
if [ "$DEVICE" = cuda ]; then
  STEPS="${STEPS:-26}" FROM="${FROM:-5}" BUDGET="${BUDGET:-16384}" SAMPLES="${SAMPLES:-1200}"
  PRECISION="${PRECISION:-bf16}" HF_DTYPE=bfloat16
else
  STEPS="${STEPS:-6}" FROM="${FROM:-2}" BUDGET="${BUDGET:-512}" SAMPLES="${SAMPLES:-120}"
  PRECISION="${PRECISION:-f32}" HF_DTYPE=float32
fi
LORA_R="${LORA_R:-64}"
BENCH="${BENCH:-$REPO/scripts/baselines}"
HF_STEP="$BENCH/hf_train_step.py"
[ -f "$HF_STEP" ] || HF_STEP="$BENCH/hf_reference_step.py"
mkdir -p "$OUT"
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/device_bench.log") 2>&1
export NO_PROGRESS=1 PYTHONUNBUFFERED=1

if [ "$DEVICE" = cuda ]; then
  # libtorch, its CUDA libraries and NCCL from the machine's PyTorch (the same 2.11 wheel).
  torch_dir=$("$PY" -c 'import importlib.util as u
print(u.find_spec("torch").submodule_search_locations[0])' 2>/dev/null)
  if [ -n "$torch_dir" ]; then
    libs="$torch_dir/lib"
    for d in "$(dirname "$torch_dir")"/nvidia/*/lib; do libs="$libs:$d"; done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  nvidia-smi -L || echo "nvidia-smi: none"
fi
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
lscpu | grep -m1 'Model name' || true

failed=()
t0=$(date +%s)
# step NAME SECONDS [--gpu TAG] [--log FILE] CMD...: runs CMD under a time limit, logs its
# duration, records a failure; --gpu samples the GPU's used memory (MiB) into $W/TAG.gpumem
# meanwhile; --log sends CMD's output to FILE (then shows it).
step() {
  local name=$1 limit=$2; shift 2
  local tag="" log="" sampler="" rc
  while [ $# -gt 0 ]; do
    case $1 in
      --gpu) tag=$2; shift 2 ;;
      --log) log=$2; shift 2 ;;
      *) break ;;
    esac
  done
  echo; echo "== [$(( $(date +%s) - t0 ))s] $name"
  local s=$(date +%s)
  if [ -n "$tag" ] && [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$W/$tag.gpumem" &
    sampler=$!
  fi
  if [ -n "$log" ]; then
    timeout "$limit" "$@" >"$log" 2>&1; rc=$?; cat "$log"
  else
    timeout "$limit" "$@"; rc=$?
  fi
  if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; fi
  if [ $rc -eq 0 ]; then
    echo "-- $name: ok in $(( $(date +%s) - s ))s"
  else
    echo "-- $name: FAILED (exit $rc) after $(( $(date +%s) - s ))s"
    failed+=("$name")
  fi
}

# 1. checkpoints: real configs, random weights, bf16 (cuda); the tiny preset on a CPU dry run
if [ -n "${HUB:-}" ]; then
  VISION="$HUB/siglip" LM="$HUB/qwen"
elif [ "$DEVICE" = cuda ]; then
  step "make_hub_shaped_models.py" 300 "$PY" "$BENCH/make_hub_shaped_models.py" "$W/hub"
  VISION="$W/hub/siglip" LM="$W/hub/qwen"
else
  step "init-model tiny" 60 "$T" init-model --quiet --preset tiny --out "$W/tiny"
  VISION="$W/tiny/vision" LM="$W/tiny/lm"
fi

# 2. shards: LLaVA-Pretrain-shaped image samples (a caption + one image each)
step synth 120 "$T" synth --quiet --out "$W/llava" --samples "$SAMPLES" --seed 0
step ingest 180 "$T" ingest --quiet --json "$W/llava/blip_laion_cc_sbu_558k.json" \
  --images "$W/llava/images" --tokenizer "$DIR/tokenizer.json" --out "$W/shards"

# 3. tessera, stage 1 and stage 2 (LoRA), one packed row of BUDGET tokens per step
prec=()
"$T" train --help 2>/dev/null | grep -q -- '--precision' && prec=(--precision "$PRECISION")
common=(--shards "$W/shards" --vision "$VISION" --lm "$LM" --device "$DEVICE"
  --token-budget "$BUDGET" --seq-len "$BUDGET" --steps "$STEPS" --loader-threads 8
  --collective-timeout 300 --quiet "${prec[@]}")
step "tessera stage 1" 240 --gpu s1 "$T" train "${common[@]}" --stage 1 --out "$W/s1"
step "tessera stage 2 (LoRA r $LORA_R)" 240 --gpu s2 "$T" train "${common[@]}" --stage 2 \
  --lora-r "$LORA_R" --lora-alpha $((2 * LORA_R)) --init-projector "$W/s1" --out "$W/s2"

# 4. the baseline on the same device, same images / tokens / supervised tokens per step
per_step=$("$PY" - "$W/s1/metrics.jsonl" "$FROM" <<'EOF' 2>/dev/null
import json, statistics as st, sys
m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][int(sys.argv[2]):]
print(round(st.median(x["images"] for x in m)), round(st.median(x["real_tokens"] for x in m)),
      round(st.median(x["supervised_tokens"] for x in m)))
EOF
)
read -r IMAGES TOKENS SUPERVISED <<<"${per_step:-}"
if [ -n "${IMAGES:-}" ]; then
  step "transformers baseline" 300 --gpu hf --log "$W/hf.log" "$PY" "$HF_STEP" \
    "$VISION" "$LM" --device "$DEVICE" --dtype "$HF_DTYPE" --images "$IMAGES" --tokens "$TOKENS" \
    --supervised "$SUPERVISED" --steps $((STEPS - FROM + 1)) --threads "$(nproc)"
else
  echo "no stage-1 metrics: baseline skipped"; failed+=("transformers baseline")
fi

# 5. same-run matmul peak of the compute dtype (the MFU denominator next to the nominal one)
PEAK=$("$PY" - "$DEVICE" "$HF_DTYPE" <<'EOF' 2>/dev/null
import sys, time, torch
dev, dt = sys.argv[1], getattr(torch, sys.argv[2])
n = 8192 if dev == "cuda" else 1024
a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(3): a @ b
sync(); t = time.time(); reps = 20
for _ in range(reps): a @ b
sync(); print(f"{2 * n**3 * reps / (time.time() - t):.4e}")
EOF
)
echo "same-run matmul peak ($HF_DTYPE): ${PEAK:-unknown} FLOP/s"

for f in s1/metrics.jsonl s2/metrics.jsonl; do
  [ -f "$W/$f" ] && cp "$W/$f" "$OUT/${f%%/*}_metrics.jsonl"
done
echo
"$PY" - "$W" "$VISION" "$LM" "$FROM" "${PEAK:-0}" "$DEVICE" <<'EOF' | tee "$OUT/summary.txt"
import json, os, re, statistics as st, sys
w, vision_dir, lm_dir, first, peak, device = sys.argv[1:7]
first, peak = int(first), float(peak)
NOMINAL = 989e12  # H100 / H200 SXM dense bf16 (the spec sheet's figure without sparsity)
vc = json.load(open(os.path.join(vision_dir, "config.json")))
vc = vc.get("vision_config", vc)
lc = json.load(open(os.path.join(lm_dir, "config.json")))

def model_flops(m, lora_r):
    """Model FLOPs of one step (no recompute): frozen weights forward + input gradients (2x the
    forward), trained weights 3x; attention causal within each sample (one image + caption)."""
    d, ff, layers = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"] - 1
    side, patch = vc["image_size"], vc["patch_size"]
    ntok = (side // patch) ** 2
    vis = ntok * (2 * 3 * patch * patch * d + layers * 2 * (4 * d * d + 2 * d * ff)) \
        + layers * 4 * ntok * ntok * d
    h, f, L = lc["hidden_size"], lc["intermediate_size"], lc["num_hidden_layers"]
    hd = h // lc["num_attention_heads"]
    kv = lc.get("num_key_value_heads", lc["num_attention_heads"]) * hd
    per_tok = L * 2 * (h * (h + 2 * kv) + h * h + 3 * h * f)
    tokens, images = m["real_tokens"], max(m["images"], 1)
    seq = tokens / images
    attn = L * 2 * h * seq * tokens  # causal: qk and pv over half the square, per sample
    proj = images * ntok * 2 * (d * h + h * h)
    head = m["supervised_tokens"] * 2 * h * lc["vocab_size"]
    lora = 0
    if lora_r:
        per_layer = (h + h) + (h + kv) * 2 + (h + h) + (h + f) * 2 + (f + h)
        lora = tokens * L * 2 * lora_r * per_layer
    return images * vis + 2 * (tokens * per_tok + head) + 3 * attn + 3 * proj + 3 * lora

def load(run):
    p = os.path.join(w, run, "metrics.jsonl")
    return [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []

def gpu_peak(name):
    p = os.path.join(w, name + ".gpumem")
    vals = [int(x) for x in open(p).read().split() if x.isdigit()] if os.path.exists(p) else []
    return max(vals) if vals else None

rates = {}
for run, lora_r in (("s1", 0), ("s2", 64)):
    m = load(run)[first:]
    if not m:
        print(f"{run}: no metrics")
        continue
    secs = sum(x["step_time_s"] for x in m)
    tok = sum(x["real_tokens"] for x in m) / secs
    img = sum(x["images"] for x in m) / secs
    flops = sum(model_flops(x, lora_r) for x in m) / secs
    mem = gpu_peak(run)
    rates[run] = tok
    line = (f"tessera {run}: {tok:,.0f} real tokens/s, {img:,.1f} images/s, "
            f"{secs / len(m) * 1000:.0f} ms/step (steps {m[0]['step']}-{m[-1]['step']}), "
            f"{flops / 1e12:.1f} model TFLOP/s")
    if device == "cuda":
        line += f", MFU {flops / NOMINAL:.1%} of 989 TFLOP/s"
    if peak > 0:
        line += f", {flops / peak:.1%} of the same-run matmul peak"
    if mem is not None:
        line += f", peak GPU memory {mem:,} MiB (nvidia-smi, whole device)"
    print(line)
    print("  losses every 5th step: " + " ".join("%.4f" % x["loss"] for x in load(run)[::5]))
hf = os.path.join(w, "hf.log")
if os.path.exists(hf):
    text = open(hf).read()
    times = [float(t) for i, t in re.findall(r"^step (\d+): ([\d.]+)s", text, re.M) if int(i) > 0]
    args = re.search(r"row of (\d+) tokens", text)
    if times and args:
        tokens = int(args.group(1))
        hf_tok = tokens / st.median(times)
        mem = gpu_peak("hf")
        print(f"transformers baseline: {hf_tok:,.0f} tokens/s ({st.median(times) * 1000:.0f} ms/step median, "
              f"{len(times)} steps after the first)" + (f", peak GPU memory {mem:,} MiB" if mem else ""))
        if "s1" in rates:
            print(f"RATIO tessera/transformers stage-1 tokens/s {rates['s1'] / hf_tok:.2f} "
                  f"(tessera {rates['s1']:,.0f}, transformers {hf_tok:,.0f}, {device})")
EOF
echo
echo "== done in $(( $(date +%s) - t0 ))s; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
