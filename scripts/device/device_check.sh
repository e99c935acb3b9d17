#!/usr/bin/env bash
# One-GPU check of the trainer's CUDA path (`cargo build --release --features cuda`) against its
# CPU path on the same data, for the lent GPU machine:
#   synth -> ingest -> init-model tiny -> stage 1 on cuda and on cpu (losses side by side) ->
#   stage 1 through the launcher (--nproc 1: TCPStore + NCCL rendezvous) -> stage 2 (LoRA) on
#   cuda -> export; then timed stage-1 runs of the `small` preset (cuda vs cpu) and a few cuda
#   steps of the `qwen2.5-0.5b-shape` preset.
# Usage: bash scripts/device/device_check.sh DIR   DIR holds `tessera` and `tokenizer.json`.
# Logs and metrics go to $OUT (default /tmp/device_check_out). Knobs: STEPS (20), CPU_ONLY=1
# (skip every cuda run: checks the script itself on a machine without a GPU).
set -uo pipefail
DIR="$(cd "${1:?usage: device_check.sh DIR}" && pwd)"
OUT="${OUT:-/tmp/device_check_out}"
STEPS="${STEPS:-20}"
W=/tmp/tessera_device_check
T="$DIR/tessera"
mkdir -p "$OUT"
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/device_check.log") 2>&1
export NO_PROGRESS=1

# libtorch, its CUDA libraries and NCCL from the machine's PyTorch (same 2.11.0 wheel).
torch_dir=$(python3 -c 'import importlib.util as u
print(u.find_spec("torch").submodule_search_locations[0])' 2>/dev/null)
if [ -n "$torch_dir" ]; then
  libs="$torch_dir/lib"
  for d in "$(dirname "$torch_dir")"/nvidia/*/lib; do libs="$libs:$d"; done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi -L || echo "nvidia-smi: none"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
ldd "$T" | grep -E 'not found|torch|c10|cudart|nccl' || true

failed=()
t0=$(date +%s)
# step NAME SECONDS CMD...: runs CMD under a time limit, logs its duration, records a failure.
step() {
  local name=$1 limit=$2; shift 2
  echo; echo "== [$(( $(date +%s) - t0 ))s] $name"
  local s=$(date +%s)
  if timeout "$limit" "$@"; then
    echo "-- $name: ok in $(( $(date +%s) - s ))s"
  else
    echo "-- $name: FAILED (exit $?) after $(( $(date +%s) - s ))s"
    failed+=("$name")
  fi
}
cuda() { [ "${CPU_ONLY:-0}" = 1 ] || step "$@"; }
gpu=cuda; [ "${CPU_ONLY:-0}" = 1 ] && gpu=cpu   # where stage 2 runs

step synth 120 "$T" synth --quiet --out "$W/llava" --samples 1000 --seed 0
step ingest 120 "$T" ingest --json "$W/llava/blip_laion_cc_sbu_558k.json" \
  --images "$W/llava/images" --tokenizer "$DIR/tokenizer.json" --out "$W/shards"
step "init-model tiny" 60 "$T" init-model --quiet --preset tiny --out "$W/tiny"

tiny=(--shards "$W/shards" --vision "$W/tiny/vision" --lm "$W/tiny/lm" --token-budget 512
  --seq-len 512 --loader-threads 2 --collective-timeout 60 --quiet)
s1=("${tiny[@]}" --stage 1 --lr 3e-2)
cuda "stage 1 cuda" 180 "$T" train "${s1[@]}" --steps "$STEPS" --device cuda --out "$W/s1_cuda"
step "stage 1 cpu" 300 "$T" train "${s1[@]}" --steps "$STEPS" --device cpu --out "$W/s1_cpu"
cuda "stage 1 cuda --nproc 1" 120 "$T" train "${s1[@]}" --steps 5 --device cuda --nproc 1 \
  --out "$W/s1_cuda_launch"
step "stage 2 (LoRA) $gpu" 180 "$T" train "${tiny[@]}" --stage 2 --steps 5 --lora-r 16 \
  --lora-alpha 32 --init-projector "$W/s1_$gpu" --device "$gpu" --out "$W/s2"
step export 60 "$T" export --quiet --run "$W/s2" --out "$W/export"
ls -R "$W/export" | head -20

# Throughput: the small preset at a GPU-sized micro-batch, same steps on each device.
step "init-model small" 60 "$T" init-model --quiet --preset small --out "$W/small"
small=(--shards "$W/shards" --vision "$W/small/vision" --lm "$W/small/lm" --token-budget 8192
  --seq-len 2048 --loader-threads 4 --collective-timeout 60 --quiet --stage 1)
# The CPU takes seconds a step here (the 151,936-row LM head), so it runs fewer steps.
cuda "small cuda" 180 "$T" train "${small[@]}" --steps 12 --device cuda --out "$W/small_cuda"
step "small cpu" 150 "$T" train "${small[@]}" --steps 5 --device cpu --out "$W/small_cpu"
if [ "${CPU_ONLY:-0}" != 1 ]; then
  step "init-model qwen2.5-0.5b-shape" 150 "$T" init-model --quiet --preset qwen2.5-0.5b-shape \
    --out "$W/big"
  step "0.5b-shape cuda" 180 "$T" train --shards "$W/shards" --vision "$W/big/vision" \
    --lm "$W/big/lm" \
    --token-budget 8192 --seq-len 2048 --loader-threads 8 --collective-timeout 120 --quiet \
    --stage 1 --steps 8 --device cuda --out "$W/big_cuda"
fi

for run in s1_cuda s1_cpu s1_cuda_launch s2 small_cuda small_cpu big_cuda; do
  [ -f "$W/$run/metrics.jsonl" ] && cp "$W/$run/metrics.jsonl" "$OUT/$run.jsonl"
done
echo
python3 - "$W" <<'EOF'
import json, sys, os
w = sys.argv[1]
def load(run):
    path = os.path.join(w, run, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    return [json.loads(line) for line in open(path) if line.strip()]
cpu, gpu, launch = load("s1_cpu"), load("s1_cuda"), load("s1_cuda_launch")
if cpu and gpu:
    print("stage 1, tiny: step  cpu loss        cuda loss       rel diff")
    worst = 0.0
    for c, g in zip(cpu, gpu):
        rel = abs(c["loss"] - g["loss"]) / abs(c["loss"])
        worst = max(worst, rel)
        print(f"  {c['step']:4d}  {c['loss']:.9f}  {g['loss']:.9f}  {rel:.2e}")
    n = min(len(cpu), len(gpu))
    print(f"max relative loss difference cuda vs cpu over {n} steps: {worst:.2e}")
if gpu and launch:
    # The 5-step run's cosine schedule parts from the 20-step one's; a step's loss depends on
    # the learning rates of the steps before it, so compare up to the first differing rate.
    same = next((i for i, (a, b) in enumerate(zip(gpu, launch)) if a["lr"] != b["lr"]), len(launch))
    pairs = list(zip(gpu, launch))[: same + 1]
    diff = max(abs(a["loss"] - b["loss"]) for a, b in pairs)
    print(f"--nproc 1 vs single-process cuda, steps 0-{len(pairs) - 1} (same lr so far): "
          f"max |loss diff| {diff:.2e}")
s2 = load("s2")
if s2:
    print("stage 2 losses:", " ".join(f"{m['loss']:.4f}" for m in s2))
def rate(run):
    m = load(run)
    if not m or len(m) < 4:
        return None
    steady = m[2:]  # steps 0-1 pay for start-up (CUDA context, allocator, kernel selection)
    tokens = sum(x["tokens"] for x in steady)
    secs = sum(x["step_time_s"] for x in steady)
    return tokens / secs, secs / len(steady), len(steady)
for run in ("small_cuda", "small_cpu", "big_cuda"):
    r = rate(run)
    if r:
        print(f"{run}: {r[0]:.0f} tokens/s ({r[1]*1000:.1f} ms/step, mean of steps 2..{r[2]+1})")
a, b = rate("small_cuda"), rate("small_cpu")
if a and b:
    print(f"small preset, cuda/cpu throughput ratio: {a[0] / b[0]:.1f}x")
EOF
echo
echo "== done in $(( $(date +%s) - t0 ))s; failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
