#!/usr/bin/env bash
# Ingest of the_cauldron-layout parquet (images embedded) against the pyarrow + PIL + tokenizers
# reference (scripts/baselines/cauldron_ingest.py) on the same file, alternating, ROUNDS rounds;
# peak RSS of the ingest at 10K and 100K rows; `bench loader` on the ingested multi-image
# shards against the PIL reference. Figures in BENCHMARKS.md, "Ingest of the_cauldron-layout
# parquet". Usage: scripts/bench/cauldron_bench.sh [OUT_DIR] (default runs/bench/cauldron); ROUNDS=2.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/bench/cauldron}
ROUNDS=${ROUNDS:-2}
T=target/release/tessera
TOK=.deps/tokenizer/tokenizer.json
REF=.deps/hfvenv/bin/python   # pyarrow, pillow and tokenizers
export NO_PROGRESS=1
mkdir -p "$OUT"
lscpu | grep "Model name"
for rows in 10000 100000; do
  data="$OUT/c$rows/train.parquet"
  [ -f "$data" ] || .deps/venv/bin/python scripts/baselines/make_cauldron_parquet.py \
    /usr/share/backgrounds/mate "$data" "$rows"
done
report() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"records={r['report']['records_read']} seconds={r['seconds']:.2f} records_per_s={r['records_per_s']:.1f}\")" "$1/ingest_report.json"; }
for round in $(seq "$ROUNDS"); do
  echo "== round $round: 10,000 rows, tessera then the reference (2 workers each), load $(cut -d' ' -f1 /proc/loadavg)"
  rm -rf "$OUT/t10k" "$OUT/r10k"
  /usr/bin/time -f "tessera wall_s=%e peak_rss_kib=%M" "$T" ingest --quiet --input "$OUT/c10000" \
    --template chatml --tokenizer "$TOK" --workers 2 --out "$OUT/t10k"
  report "$OUT/t10k"
  /usr/bin/time -f "reference wall_s=%e peak_rss_kib=%M" "$REF" scripts/baselines/cauldron_ingest.py \
    "$OUT/c10000/train.parquet" "$TOK" "$OUT/r10k" --workers 2
done
echo "== 100,000 rows, tessera (peak RSS against the 10,000-row run), load $(cut -d' ' -f1 /proc/loadavg)"
rm -rf "$OUT/t100k"
/usr/bin/time -f "tessera wall_s=%e peak_rss_kib=%M" "$T" ingest --quiet --input "$OUT/c100000" \
  --template chatml --tokenizer "$TOK" --workers 2 --out "$OUT/t100k"
report "$OUT/t100k"
echo "== bench loader on the 10,000-row shards (1 to 3 images a sample), 384 px, 2 threads"
"$T" bench loader --shards "$OUT/t10k" --threads 2 --image-size 384 --limit 2000 | tail -n 1
