#!/usr/bin/env bash
# The object-storage loader benchmark of BENCHMARKS.md: `tessera bench loader --shards s3://...`
# against moto's S3 server on 127.0.0.1 (from scripts/setup/setup.sh), next to the same shards on
# local disk, cold and warm cache; then again with 20 ms added before every request (the
# TESSERA_REMOTE_LATENCY_MS hook, compiled in only with the `test-hooks` feature: this script
# builds target/release/tessera with it; `make build` builds the plain binary again).
# Usage: scripts/bench/bench_s3.sh [SHARD_DIR] (default: runs/bench/photos-shards, made as bench.sh does)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/bench
T=target/release/tessera
cargo build --release --features test-hooks
SHARDS=${1:-$OUT/photos-shards}
mkdir -p "$OUT"
export NO_PROGRESS=1
if [ ! -f "$SHARDS/index.json" ]; then
  "$T" synth --quiet --out "$OUT/photos" --samples 2200 --text-only-fraction 0.1 --photos /usr/share/backgrounds/mate
  "$T" ingest --quiet --json "$OUT/photos/blip_laion_cc_sbu_558k.json" --images "$OUT/photos/images" \
    --tokenizer .deps/tokenizer/tokenizer.json --out "$SHARDS"
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
.deps/moto/bin/moto_server -H 127.0.0.1 -p "$PORT" >/dev/null 2>&1 &
MOTO=$!
trap 'kill $MOTO' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
  AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
curl -sf -X PUT "http://127.0.0.1:$PORT/bench" >/dev/null
for f in "$SHARDS"/*; do
  curl -sf -H "Expect:" -X PUT --upload-file "$f" "http://127.0.0.1:$PORT/bench/shards/$(basename "$f")" >/dev/null
done
echo "== loader from s3:// (moto on 127.0.0.1) vs local disk, cold and warm cache"
"$T" bench loader --shards s3://bench/shards --threads 2 --image-size 384 --limit 1980 --policy pad \
  | tee "$OUT/loader-s3.log" | tail -n 1 > "$OUT/loader-s3.json"
echo "== the same with 20 ms before every request"
TESSERA_REMOTE_LATENCY_MS=20 "$T" bench loader --shards s3://bench/shards --threads 2 --image-size 384 \
  --limit 1980 --policy pad | tee "$OUT/loader-s3-20ms.log" | tail -n 1 > "$OUT/loader-s3-20ms.json"
