#!/usr/bin/env bash
# What keeping freed memory does for a small multi-rank CPU run (docs/performance-notes.md,
# "Memory"): the tiny preset's stage 1 (8 steps, seq len 256, 200 synth samples) at W=2 and W=4,
# as the trainer runs it (`kept`) against glibc's defaults (`defaults`: the same binary with
# `mallopt` made a no-op by a one-line LD_PRELOAD shim, compiled here, so the trainer's settings
# never take effect). Runs alternate (defaults, kept, defaults, ...) so machine load hits both
# alike. Each line: mode, ranks, wall s, sys s (the whole job), page faults (`perf stat`), the
# largest peak RSS of any process; last lines: kept wall / defaults wall per world size (medians).
#
# usage: scripts/bench/allocator_bench.sh [ROUNDS]   (default 3)
# Needs: target/release/tessera (cargo build --release), .deps/tokenizer (make setup), perf, cc.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
T=$PWD/target/release/tessera
W=$PWD/data/allocator_bench
for need in "$T" .deps/tokenizer/tokenizer.json; do
  [ -e "$need" ] || { echo "allocator_bench: $need is missing (see the header)" >&2; exit 1; }
done
for tool in perf cc; do
  command -v "$tool" >/dev/null || { echo "allocator_bench: $tool is not installed" >&2; exit 1; }
done
mkdir -p "$W"
printf 'int mallopt(int param, int value) { (void)param; (void)value; return 1; }\n' > "$W/nomallopt.c"
cc -shared -fPIC -O2 -o "$W/nomallopt.so" "$W/nomallopt.c"

if [ ! -e "$W/shards/index.json" ]; then
  rm -rf "$W/llava" "$W/model" "$W/shards"
  "$T" synth --quiet --samples 200 --text-only-fraction 0 --seed 3 --out "$W/llava"
  "$T" init-model --quiet --preset tiny --family qwen2 \
    --tokenizer .deps/tokenizer/tokenizer.json --out "$W/model"
  "$T" ingest --quiet --json "$W/llava/blip_laion_cc_sbu_558k.json" --images "$W/llava/images" \
    --tokenizer "$W/model/lm/tokenizer.json" --out "$W/shards"
fi

one_run() { # MODE NPROC -> "MODE NPROC wall sys faults rss_mb"
  local preload=""
  [ "$1" = defaults ] && preload="$W/nomallopt.so"
  rm -rf "$W/out"
  LD_PRELOAD=$preload /usr/bin/time -f "%e %S %M" -o "$W/time.txt" \
    perf stat -x, -e page-faults -o "$W/perf.txt" \
    "$T" train --quiet --shards "$W/shards" --vision "$W/model/vision" --lm "$W/model/lm" \
    --stage 1 --token-budget 256 --seq-len 256 --seed 5 --steps 8 --nproc "$2" --out "$W/out" \
    > "$W/train.log" 2>&1
  # The same losses either way: where memory comes from changes, not what is computed.
  grep -o "loss .*" "$W/train.log" >> "$W/losses.txt"
  local faults
  faults=$(grep page-faults "$W/perf.txt" | cut -d, -f1)
  # /usr/bin/time's %M is the largest RSS of the process and any child it waited for.
  read -r wall sys rss < "$W/time.txt"
  echo "$1 $2 $wall $sys $faults $((rss / 1024))"
}

rm -f "$W/losses.txt"
echo "mode ranks wall_s sys_s page_faults peak_rss_mb"
for _ in $(seq "$ROUNDS"); do
  for n in 2 4; do
    one_run defaults "$n"
    one_run kept "$n"
  done
done | tee "$W/results.txt"
for n in 2 4; do
  median() { grep "^$1 $n " "$W/results.txt" | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  echo "W=$n: kept / defaults wall (medians) = $(median kept) / $(median defaults) = $(echo "$(median kept) $(median defaults)" | awk '{printf "%.2f", $1/$2}')"
done
echo "distinct loss lines over every run (one per world size when both modes agree): $(sort -u "$W/losses.txt" | wc -l)"
