#!/usr/bin/env bash
# `make bench`: every benchmark of BENCHMARKS.md, each with its baseline in the same run.
# Output: one JSON line per benchmark in runs/bench/*.json (plus the full logs beside them).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/bench
T=target/release/tessera
mkdir -p "$OUT"
export NO_PROGRESS=1

echo "== planner: pack vs bucket vs fixed, LLaVA-Pretrain-shaped, W=8, B=8192"
"$T" bench plan --synthetic-llava 558128 --world-size 8 --token-budget 8192 | tee "$OUT/plan.log" | tail -n 1 > "$OUT/plan.json"

echo "== loader: real-photo crops at 384 px vs decode-only vs the PIL reference"
if [ ! -f "$OUT/photos-shards/index.json" ]; then
  "$T" synth --quiet --out "$OUT/photos" --samples 2200 --text-only-fraction 0.1 --photos /usr/share/backgrounds/mate
  "$T" ingest --quiet --json "$OUT/photos/blip_laion_cc_sbu_558k.json" --images "$OUT/photos/images" \
    --tokenizer .deps/tokenizer/tokenizer.json --out "$OUT/photos-shards"
fi
"$T" bench loader --shards "$OUT/photos-shards" --threads 2 --image-size 384 --limit 1980 --policy pad \
  | tee "$OUT/loader.log" | tail -n 1 > "$OUT/loader.json"

echo "== AnyRes views: decode + base view + anyres_max_9 tiles vs LlavaOnevisionImageProcessor, same photos"
cargo bench --bench anyres_views 2>&1 | tee "$OUT/anyres_views.log" | tail -n 1 > "$OUT/anyres_views.json"

echo "== ingest: verify / --no-verify vs the copy bound"
cargo bench --no-default-features --bench ingest 2>&1 | tee "$OUT/ingest.log" | tail -n 1 > "$OUT/ingest.json"
cargo build --release   # the ingest bench rebuilt the binary without libtorch

echo "== ingest of the_cauldron-layout parquet vs pyarrow + PIL + tokenizers; peak RSS at 10K and 100K rows; loader on multi-image shards"
bash scripts/bench/cauldron_bench.sh "$OUT/cauldron" 2>&1 | tee "$OUT/cauldron.log" | tail -n 1 > "$OUT/cauldron.json"

echo "== model: forward+backward tokens/s vs peak matmul"
cargo bench --bench model --features bench 2>&1 | tee "$OUT/model.log" | tail -n 5

echo "== fsdp: step time W=2 vs W=1, bytes vs theory"
cargo bench -p tessera-train --bench fsdp_step 2>&1 | tee "$OUT/fsdp.log" | tail -n 1 > "$OUT/fsdp.json"
echo "results in $OUT"
