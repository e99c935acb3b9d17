#!/usr/bin/env bash
# Every GPU check of the bring-up, in ONE call of at most ~9 minutes on a lent H100/H200 (the
# session has 15 minutes of device time in all, so each stage has a time limit, a stage that
# fails does not stop the ones after it, and a stage that would pass the deadline is skipped).
# In order of what matters most:
#   1. stage 1 on the real shapes (so400m-384 + Qwen2.5-0.5B, random weights in bf16 safetensors
#      as the Hub ships them), bf16, token budget 16,384; the transformers step on the same card
#      with the same images, tokens and supervised tokens per step;
#   2. stage 2: LoRA r 64, and full-parameter (--train projector,lm, FULL_SHARD); the
#      transformers full-parameter step (--train lm) beside it;
#   3. the tiny preset on cuda (bf16) and on the CPU (f32), 30 steps, losses side by side;
#      stage 1 through the launcher (--nproc 1: TCPStore + a one-rank NCCL group) on cuda;
#   4. `tessera bench loader` at 8 and 16 threads on crops of real photographs, the PIL
#      reference in the same run;
#   5. what each switch is worth: TESSERA_DENSE_ATTENTION=1, TESSERA_SIDE_STREAM=0,
#      --recompute none, selective, every:2 and all against the default auto (stage 1's
#      recompute.json says what it chose and the peaks it estimated); a 3-step Kineto profile;
#   6. the same-run bf16 matmul peak (MFU's measured denominator).
# Then scripts/device/device_summary.py prints every figure (summary.txt under $OUT).
#
# Prepare DIR here (the recipe of scripts/device/device_bench.sh's header): a stripped `tessera` built
# with `--features cuda`, tokenizer.json, and photos/ (a few real JPEGs, e.g. Debian's
# mate-backgrounds nature/*.jpg). Run (device tool): command "bash scripts/device/device_round.sh DIR",
# carry [DIR], timeout_s 600.
# Dry run on a CPU: DEVICE=cpu bash scripts/device/device_round.sh DIR (tiny preset instead of the Hub
# shapes, f32, small budgets; every cuda-only stage is skipped). PY: a python with torch +
# transformers (default python3). DEADLINE: seconds after which no stage starts (default 520).
# ONLY: a comma list of the parts to run (s1, hf, s2, tiny, loader, switches, profile, peak;
# default all), e.g. ONLY=s1,hf,switches for a before/after pair of one change.
# LM_FAMILY: the Hub-shaped LM of the cuda stages: qwen (Qwen2.5-0.5B, default), qwen3
# (Qwen3-0.6B-Base) or smollm2 (SmolLM2-360M; its shards use DIR/smollm2-tokenizer.json, copied
# from .deps/smollm2-135m-instruct/tokenizer.json: the family's tokenizer, <image> added by ingest).
set -uo pipefail
DIR="$(cd "${1:?usage: device_round.sh DIR}" && pwd)"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$REPO"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-/tmp/device_round_out}"
W="${WORK:-/tmp/tessera_device_round}"
PY="${PY:-python3}"
DEADLINE="${DEADLINE:-520}"
T="$DIR/tessera"
TOK="$DIR/tokenizer.json"
LM_FAMILY="${LM_FAMILY:-qwen}"
case "$LM_FAMILY" in
  qwen|qwen3) ;;
  smollm2) TOK="$DIR/smollm2-tokenizer.json" ;;
  *) echo "device_round: LM_FAMILY must be qwen, qwen3 or smollm2, not $LM_FAMILY" >&2; exit 1 ;;
esac
BENCH="$REPO/scripts/baselines"
mkdir -p "$OUT"
rm -rf "$W" && mkdir -p "$W"
exec > >(tee "$OUT/device_round.log") 2>&1
export NO_PROGRESS=1 PYTHONUNBUFFERED=1
if [ "$DEVICE" = cuda ]; then
  BUDGET=16384 SAMPLES=1200 PREC=bf16 HF_DTYPE=bfloat16 S1_STEPS=26 SHORT=12 FROM=5
else
  BUDGET=1024 SAMPLES=240 PREC=f32 HF_DTYPE=float32 S1_STEPS=6 SHORT=4 FROM=2
fi
echo "device_round: DEVICE=$DEVICE BUDGET=$BUDGET FROM=$FROM DEADLINE=${DEADLINE}s"

if [ "$DEVICE" = cuda ]; then
  # libtorch, its CUDA libraries and NCCL from the machine's PyTorch (the same 2.11 wheel).
  torch_dir=$("$PY" -c 'import importlib.util as u
print(u.find_spec("torch").submodule_search_locations[0])' 2>/dev/null)
  if [ -n "$torch_dir" ]; then
    libs="$torch_dir/lib"
    for d in "$(dirname "$torch_dir")"/nvidia/*/lib "$(dirname "$torch_dir")"/nvidia/*/*/lib; do
      [ -d "$d" ] && libs="$libs:$d"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  ldd "$T" | grep -E 'not found|torch_cuda|nccl' || true
fi
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
lscpu | grep -m1 'Model name' || true
echo "cores: $(nproc)"

failed=() skipped=()
t0=$(date +%s)
# stage NAME SECONDS [--gpu TAG] [--log FILE] CMD...: runs CMD under a time limit, records a
# failure and goes on; --gpu samples the device's used memory (MiB, nvidia-smi) into
# $W/TAG.gpumem; --log keeps CMD's output in FILE too. Skipped when it could pass DEADLINE.
stage() {
  local name=$1 limit=$2; shift 2
  local tag="" log="" sampler="" rc now
  while [ $# -gt 0 ]; do
    case $1 in
      --gpu) tag=$2; shift 2 ;;
      --log) log=$2; shift 2 ;;
      *) break ;;
    esac
  done
  now=$(( $(date +%s) - t0 ))
  if [ $(( now + limit / 2 )) -gt "$DEADLINE" ]; then
    echo "== [${now}s] $name: SKIPPED (deadline)"; skipped+=("$name"); return
  fi
  [ $(( now + limit )) -gt "$DEADLINE" ] && limit=$(( DEADLINE - now ))
  echo; echo "== [${now}s] $name"
  local s=$(date +%s)
  if [ -n "$tag" ] && [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$W/$tag.gpumem" &
    sampler=$!
  fi
  if [ -n "$log" ]; then
    timeout "$limit" "$@" >"$log" 2>&1; rc=$?; tail -n 40 "$log"
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
on_cuda() { [ "$DEVICE" = cuda ]; }
ONLY="${ONLY:-s1,hf,s2,tiny,loader,switches,profile,peak}"
want() { case ",$ONLY," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# per_step RUN: the medians of images, real tokens and supervised tokens per step of RUN.
per_step() {
  "$PY" - "$W/$1/metrics.jsonl" "$FROM" <<'EOF' 2>/dev/null
import json, statistics as st, sys
m = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][int(sys.argv[2]):]
print(round(st.median(x["images"] for x in m)), round(st.median(x["real_tokens"] for x in m)),
      round(st.median(x["supervised_tokens"] for x in m)))
EOF
}

# 0. fixtures: checkpoints, LLaVA-shaped shards, real-photo shards for the loader
if on_cuda; then
  extra=()
  [ "$LM_FAMILY" = qwen ] || extra=("$LM_FAMILY")
  stage "hub-shaped checkpoints" 240 "$PY" "$BENCH/make_hub_shaped_models.py" "$W/hub" "${extra[@]}"
  VISION="$W/hub/siglip" LM="$W/hub/$LM_FAMILY"
  if [ ! -f "$LM/config.json" ] && [ "$LM_FAMILY" = qwen ]; then  # the same shapes from tessera's own preset
    stage "init-model qwen2.5-0.5b-shape" 150 "$T" init-model --quiet --preset qwen2.5-0.5b-shape \
      --out "$W/hub"
    VISION="$W/hub/vision" LM="$W/hub/lm"
  fi
else
  stage "init-model tiny (as the hub stand-in)" 60 "$T" init-model --quiet --preset tiny --out "$W/hub"
  VISION="$W/hub/vision" LM="$W/hub/lm"
fi
stage "init-model tiny" 60 "$T" init-model --quiet --preset tiny --out "$W/tiny"
stage synth 90 "$T" synth --quiet --out "$W/llava" --samples "$SAMPLES" --seed 0
stage ingest 90 "$T" ingest --quiet --json "$W/llava/blip_laion_cc_sbu_558k.json" \
  --images "$W/llava/images" --tokenizer "$TOK" --out "$W/shards"

common=(--shards "$W/shards" --vision "$VISION" --lm "$LM" --device "$DEVICE" --precision "$PREC"
  --token-budget "$BUDGET" --seq-len "$BUDGET" --loader-threads 8 --collective-timeout 300 --quiet)

# 1. stage 1 and the transformers step
want s1 && stage "tessera stage 1" 150 --gpu s1 "$T" train "${common[@]}" --stage 1 --steps "$S1_STEPS" \
  --out "$W/s1"
read -r IMAGES TOKENS SUPERVISED <<<"$(per_step s1)"
if [ -n "${IMAGES:-}" ] && want hf; then
  stage "transformers stage 1" 150 --gpu hf_s1 --log "$W/hf_s1.log" "$PY" "$BENCH/hf_train_step.py" \
    "$VISION" "$LM" --device "$DEVICE" --dtype "$HF_DTYPE" --images "$IMAGES" --tokens "$TOKENS" \
    --supervised "$SUPERVISED" --steps $((S1_STEPS - FROM + 1)) --threads "$(nproc)"
fi

# 2. stage 2: LoRA r 64 and full-parameter; the transformers full-parameter step
want s2 && stage "tessera stage 2 LoRA r 64" 120 --gpu s2_lora "$T" train "${common[@]}" --stage 2 \
  --lora-r 64 --lora-alpha 128 --init-projector "$W/s1" --steps "$SHORT" --out "$W/s2_lora"
want s2 && stage "tessera stage 2 full (projector,lm)" 150 --gpu s2_full "$T" train "${common[@]}" --stage 2 \
  --train projector,lm --strategy full_shard --init-projector "$W/s1" --steps "$SHORT" \
  --out "$W/s2_full"
IMAGES=""
want s2 && read -r IMAGES TOKENS SUPERVISED <<<"$(per_step s2_full)"
if [ -n "${IMAGES:-}" ] && want hf; then
  stage "transformers full (--train lm)" 120 --gpu hf_full --log "$W/hf_full.log" "$PY" \
    "$BENCH/hf_train_step.py" "$VISION" "$LM" --device "$DEVICE" --dtype "$HF_DTYPE" \
    --images "$IMAGES" --tokens "$TOKENS" --supervised "$SUPERVISED" --train lm \
    --steps $((SHORT - FROM + 1)) --threads "$(nproc)"
fi

# 3. tiny: cuda bf16 vs cpu f32 losses; the launcher's one-rank NCCL group
tiny=(--shards "$W/shards" --vision "$W/tiny/vision" --lm "$W/tiny/lm" --token-budget 512
  --seq-len 512 --loader-threads 2 --collective-timeout 60 --quiet --stage 1 --lr 3e-2)
if on_cuda && want tiny; then
  stage "tiny cuda bf16" 90 "$T" train "${tiny[@]}" --steps 30 --device cuda --precision bf16 \
    --out "$W/tiny_cuda"
  stage "tiny cuda --nproc 1" 90 "$T" train "${tiny[@]}" --steps 5 --device cuda --nproc 1 \
    --precision bf16 --out "$W/tiny_launch"
fi
want tiny && stage "tiny cpu f32" 120 "$T" train "${tiny[@]}" --steps 30 --device cpu --precision f32 \
  --out "$W/tiny_cpu"

# 4. the loader on real photos, 8 and 16 threads, the PIL reference in the same run
if ! want loader; then
  :
elif [ -d "$DIR/photos" ]; then
  stage "synth photos" 90 "$T" synth --quiet --out "$W/photos" --samples 2200 \
    --text-only-fraction 0.1 --photos "$DIR/photos"
  stage "ingest photos" 90 "$T" ingest --quiet --json "$W/photos/blip_laion_cc_sbu_558k.json" \
    --images "$W/photos/images" --tokenizer "$TOK" --out "$W/photo_shards"
  for threads in 8 16; do
    stage "bench loader $threads threads" 90 --log "$W/loader_$threads.log" "$T" bench loader \
      --shards "$W/photo_shards" --threads "$threads" --image-size 384 --limit 1980 --policy pad
  done
else
  echo "no $DIR/photos: loader bench skipped"; skipped+=("bench loader")
fi

# 5. what each switch is worth (short stage-1 runs against the main one's steady steps)
want switches && [ -z "${NO_DENSE:-}" ] && stage "stage 1 dense attention" 100 --gpu v_dense env TESSERA_DENSE_ATTENTION=1 "$T" train \
  "${common[@]}" --stage 1 --steps "$SHORT" --out "$W/v_dense"
if on_cuda && want switches; then
  stage "stage 1 side stream off" 100 --gpu v_noside env TESSERA_SIDE_STREAM=0 "$T" train \
    "${common[@]}" --stage 1 --steps "$SHORT" --out "$W/v_noside"
fi
want switches && stage "stage 1 recompute none" 100 --gpu v_norecompute "$T" train "${common[@]}" --stage 1 \
  --recompute none --steps "$SHORT" --out "$W/v_norecompute"
want switches && stage "stage 1 recompute selective" 100 --gpu v_selective "$T" train "${common[@]}" \
  --stage 1 --recompute selective --steps "$SHORT" --out "$W/v_selective"
want switches && stage "stage 1 recompute every:2" 100 --gpu v_every2 "$T" train "${common[@]}" --stage 1 \
  --recompute every:2 --steps "$SHORT" --out "$W/v_every2"
want switches && stage "stage 1 recompute all" 100 --gpu v_recompute_all "$T" train "${common[@]}" \
  --stage 1 --recompute all --steps "$SHORT" --out "$W/v_recompute_all"
want profile && stage "stage 1 profiled (3 steps)" 100 "$T" train "${common[@]}" --stage 1 --steps 4 --profile 3 \
  --out "$W/v_profile"

# 6. same-run matmul peak of the compute dtype
want peak && stage "matmul peak" 60 --log "$W/peak.log" "$PY" - "$DEVICE" "$HF_DTYPE" <<'EOF'
import sys, time, torch
dev, dt = sys.argv[1], getattr(torch, sys.argv[2])
n = 8192 if dev == "cuda" else 1024
a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(3): a @ b
sync(); t = time.time(); reps = 20
for _ in range(reps): a @ b
sync(); print(f"PEAK {2 * n**3 * reps / (time.time() - t):.4e}")
EOF

for run in s1 s2_lora s2_full tiny_cuda tiny_launch tiny_cpu v_dense v_noside v_norecompute \
  v_selective v_every2 v_recompute_all; do
  [ -f "$W/$run/metrics.jsonl" ] && cp "$W/$run/metrics.jsonl" "$W/${run}.jsonl"
  [ -f "$W/$run/recompute.json" ] && cp "$W/$run/recompute.json" "$W/${run}.recompute.json"
done
ls "$W"/v_profile/profile_rank*.json 2>/dev/null | head -1 | xargs -r -I{} gzip -c {} >"$OUT/profile_rank0.json.gz"
echo
"$PY" "$REPO/scripts/device/device_summary.py" "$W" "$VISION" "$LM" "$FROM" "$DEVICE" | tee "$OUT/summary.txt"
tar -czf "$OUT/metrics.tgz" -C "$W" $(cd "$W" && ls *.jsonl *.log *.gpumem 2>/dev/null) 2>/dev/null
echo
echo "== done in $(( $(date +%s) - t0 ))s; failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}"
[ ${#failed[@]} -eq 0 ]
