#!/usr/bin/env bash
# tessera's AnyRes stage 1 step against transformers' LlavaOnevisionForConditionalGeneration on
# the same samples (issue 39): init-model's `small` tower and LM (SigLIP 128 px / patch 16, 4
# layers; a 6-layer Qwen2 of hidden 256 with Qwen's vocabulary), real photos (synth --photos,
# mate-backgrounds crops at LLaVA-Pretrain sizes), --image-layout anyres_max_9 (tiles of 128 px,
# pinpoints 128..768), f32, W=1, 2 threads. tessera trains STEPS steps and is exported as
# llava-onevision; scripts/baselines/onevision_train_step.py then trains that export on the
# samples each of tessera's steps trained (from its plan.jsonl) through the export's own
# processor, as one padded batch. Runs alternate (tessera, transformers, ...); each run's first
# step is warm-up and left out.
#
# usage: scripts/bench/anyres_vs_hf.sh [ROUNDS]   (default 2)
# env:   STEPS=5  BUDGET=4096 (tokens per micro-batch, one row)  SAMPLES=96
# Last line: "RATIO tessera/transformers median step <r> (<t> s / <h> s)".
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
STEPS=${STEPS:-5}
BUDGET=${BUDGET:-4096}
SAMPLES=${SAMPLES:-96}
T=target/release/tessera
PY=.deps/hfvenv/bin/python
W=data/anyres_vs_hf
say() { echo "anyres_vs_hf: $*" >&2; }
[ -x "$T" ] || { say "build first: cargo build --release"; exit 1; }
[ -x "$PY" ] || { say "run scripts/setup/setup.sh first (.deps/hfvenv)"; exit 1; }
mkdir -p "$W"
if [ ! -f "$W/shards/index.json" ]; then
  rm -rf "$W/llava" "$W/model" "$W/shards"
  "$T" synth --quiet --samples "$SAMPLES" --text-only-fraction 0 --seed 11 \
    --photos /usr/share/backgrounds/mate --out "$W/llava"
  "$T" init-model --quiet --preset small --tokenizer .deps/tokenizer/tokenizer.json --out "$W/model"
  "$T" ingest --quiet --json "$W/llava/blip_laion_cc_sbu_558k.json" --images "$W/llava/images" \
    --tokenizer "$W/model/lm/tokenizer.json" --out "$W/shards"
fi
"$T" shards stats "$W/shards" --image-layout anyres_max_9 --tile-size 128 --patch-size 16 | tail -4 >&2
ours=() theirs=()
for r in $(seq 1 "$ROUNDS"); do
  run="$W/run$r"
  rm -rf "$run" "$W/export$r"
  TESSERA_LOADER_THREADS=2 "$T" train --quiet --stage 1 --shards "$W/shards" \
    --vision "$W/model/vision" --lm "$W/model/lm" --image-layout anyres_max_9 \
    --token-budget "$BUDGET" --seq-len "$BUDGET" --recompute none --steps "$STEPS" --out "$run"
  t=$("$PY" -c '
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%.3f" % statistics.median(s["step_time_s"] for s in steps[1:]))' "$run/metrics.jsonl")
  "$T" export --run "$run" --format llava-onevision --dtype f32 --out "$W/export$r" >/dev/null
  h=$("$PY" scripts/baselines/onevision_train_step.py "$W/export$r" "$W/shards" "$run/plan.jsonl" \
    --threads 2 | tee /dev/stderr | awk '/^BASELINE/ {print $4}')
  say "round $r: tessera $t s/step, transformers $h s/step"
  ours+=("$t") theirs+=("$h")
done
"$PY" - "${ours[*]}" "${theirs[*]}" <<'PY'
import statistics, sys
ours = [float(x) for x in sys.argv[1].split()]
theirs = [float(x) for x in sys.argv[2].split()]
t, h = statistics.median(ours), statistics.median(theirs)
print(f"RATIO tessera/transformers median step {t / h:.3f} ({t:.3f} s / {h:.3f} s)")
PY
