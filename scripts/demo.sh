#!/usr/bin/env bash
# `make demo`: the whole main job on a laptop-sized example, with gloo on localhost.
#   synth (2,000 LLaVA-Pretrain-shaped records, 20% text-only, captions that describe the
#   pictures) -> ingest -> loader bench -> init-model tiny -> stage 1 on 2 ranks -> stage 2
#   (LLaVA-1.5's full fine-tune: projector + the whole LM, FULL_SHARD) on 2 ranks -> export.
#   Prints where the loss started and ended, where the files are, captions `tessera generate`
#   writes for held-out images, and the caption score: the share of held-out images whose
#   generated caption has the reference's (first) shape word and both its colour words.
# Usage: bash scripts/demo.sh [RUN_DIR]   (default runs/demo; the folder is recreated)
# Knobs (environment): DEMO_SAMPLES (2000), DEMO_STAGE1_STEPS (150), DEMO_STAGE2_STEPS (60),
# DEMO_SCORED (64 held-out images captioned for the score).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="${1:-runs/demo}"
SAMPLES="${DEMO_SAMPLES:-2000}"
STAGE1_STEPS="${DEMO_STAGE1_STEPS:-150}"
STAGE2_STEPS="${DEMO_STAGE2_STEPS:-60}"
SCORED="${DEMO_SCORED:-64}"
T=target/release/tessera
TOKENIZER=.deps/tokenizer/tokenizer.json
[ -x "$T" ] || cargo build --release
[ -f "$TOKENIZER" ] || { echo "demo: $TOKENIZER is missing (run scripts/setup.sh)" >&2; exit 1; }
rm -rf "$RUN"
mkdir -p "$RUN"
export NO_PROGRESS=1
t0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - t0 ))s] $*"; }

step "1/7 synth: $SAMPLES records, 20% text-only -> $RUN/llava"
"$T" synth --quiet --out "$RUN/llava" --samples "$SAMPLES" --text-only-fraction 0.2 --seed 0 --zip

step "2/7 ingest (images from images.zip) -> $RUN/shards"
"$T" ingest --json "$RUN/llava/blip_laion_cc_sbu_558k.json" --images "$RUN/llava/images.zip" \
  --tokenizer "$TOKENIZER" --out "$RUN/shards"

# Held out: other records (another seed) for the validation loss, never trained on.
"$T" synth --quiet --out "$RUN/val-llava" --samples 200 --text-only-fraction 0.2 --seed 1 --zip
"$T" ingest --quiet --json "$RUN/val-llava/blip_laion_cc_sbu_558k.json" \
  --images "$RUN/val-llava/images.zip" --tokenizer "$TOKENIZER" --out "$RUN/val-shards"

step "3/7 loader bench (300 images, 64 px, as the tiny vision tower reads them)"
"$T" bench loader --quiet --shards "$RUN/shards" --limit 300 --image-size 64 --threads 2 | tail -n 1

step "4/7 init-model tiny -> $RUN/model"
"$T" init-model --quiet --preset tiny --tokenizer "$TOKENIZER" --out "$RUN/model"

common=(--shards "$RUN/shards" --vision "$RUN/model/vision" --lm "$RUN/model/lm" --nproc 2
  --token-budget 512 --seq-len 512 --loader-threads 1 --quiet
  --val-shards "$RUN/val-shards" --val-samples 64)

# Stage 1 runs at lr 3e-2, not LLaVA's 1e-3 (a batch of 256 over 2,000+ steps): here a batch
# holds about 11 images and the run lasts $STAGE1_STEPS steps. Text-only samples sit stage 1 out.
step "5/7 stage 1 (projector, lr 3e-2, warmup 3% + cosine, image samples): $STAGE1_STEPS steps on 2 ranks"
"$T" train "${common[@]}" --stage 1 --steps "$STAGE1_STEPS" --lr 3e-2 --checkpoint-every 100 --val-every 50 \
  --out "$RUN/stage1"

# Stage 2 trains projector and LM in full, as LLaVA-1.5's finetune.sh does, at rates for a
# run of $STAGE2_STEPS steps (LLaVA's 2e-5 suits 5,000 steps of a pretrained 7B LM).
step "6/7 stage 2 (full fine-tune: projector + LM at lr 3e-3): $STAGE2_STEPS steps on 2 ranks"
"$T" train "${common[@]}" --stage 2 --train projector,lm --steps "$STAGE2_STEPS" \
  --projector-lr 3e-3 --lm-lr 3e-3 --checkpoint-every 0 \
  --init-projector "$RUN/stage1" --out "$RUN/stage2"

step "7/7 export -> $RUN/export"
"$T" export --quiet --run "$RUN/stage2" --out "$RUN/export"

field() { sed -n "s/.*\"$2\": *\([-0-9.e]*\).*/\1/p" "$1/summary.json" | head -n 1; }
echo
echo "== done in $(( $(date +%s) - t0 ))s"
for stage in stage1 stage2; do
  printf '%s: loss %s -> %s (mean of the last 10%%: %s) over %s steps\n' "$stage" \
    "$(field "$RUN/$stage" first_loss)" "$(field "$RUN/$stage" last_loss)" \
    "$(field "$RUN/$stage" final_loss_mean)" "$(field "$RUN/$stage" steps)"
done
echo "files:"
echo "  shards:       $RUN/shards (index.json, shard-*.parquet)"
echo "  stage 1 run:  $RUN/stage1 (metrics.jsonl, loss.png, summary.json, checkpoints/)"
echo "  stage 2 run:  $RUN/stage2"
echo "  export:       $RUN/export (mm_projector.safetensors, lm/ (the fine-tuned LM), config.json)"
echo "captions of held-out images (tessera generate, stage 2, greedy; from the validation shards):"
"$T" generate --quiet --run "$RUN/stage2" --shards "$RUN/val-shards" --limit "$SCORED" \
  --max-new-tokens 32 --out "$RUN/samples.jsonl" > "$RUN/captions.txt"
head -n 3 "$RUN/captions.txt" | sed 's/^/  /'
python3 scripts/caption_score.py "$RUN/samples.jsonl"
printf 'final validation loss (64 held-out samples): stage 1 %s, stage 2 %s\n' \
  "$(field "$RUN/stage1" final_val_loss)" "$(field "$RUN/stage2" final_val_loss)"
