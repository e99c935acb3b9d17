#!/usr/bin/env bash
# `--checkpoint-write async` against `sync` in the same rounds (issue 20): a full fine-tune of
# projector + LM (f32, keeping activations) on the Hub-shaped models with 4 layers per tower
# (data/hub_small: the embedding is full size, so the trained state is about 2.3 GB), 5 steps
# with a checkpoint after steps 2 and 4 and at the end (the last one kept, then the run folder
# removed: the disk holds at most two checkpoints at a time). Runs alternate (sync, async, sync, ...)
# so machine load hits both alike. For each run: wall time, the sum of its step times, the
# rest (start-up and checkpoint stalls) and peak RSS; last line: async wall / sync wall.
#
# usage: scripts/bench/checkpoint_write_bench.sh [ROUNDS]   (default 2)
# env:   NPROC=1|2   ranks (default 1)
# Needs: target/release/tessera (cargo build --release), and the models and shards that
# `SHAPE=small scripts/bench/cpu_vs_hf.sh 1` prepares under data/ (run it once first).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
NPROC=${NPROC:-1}
T=target/release/tessera
W=data/checkpoint_write
for need in "$T" data/hub_small/qwen/config.json data/cpu_vs_hf/shards/index.json; do
  [ -e "$need" ] || { echo "checkpoint_write_bench: $need is missing (see the header)" >&2; exit 1; }
done
mkdir -p "$W"
export OMP_NUM_THREADS=2

one_run() { # MODE NAME -> prints "wall steps rss_gb" and a line for the reader
  local out="$W/$2"
  rm -rf "$out"
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f %M -o "$out.rss" "$T" train --quiet --stage 2 --train projector,lm \
    --shards data/cpu_vs_hf/shards --vision data/hub_small/siglip --lm data/hub_small/qwen \
    --nproc "$NPROC" --steps 5 --checkpoint-every 2 --token-budget 1536 --seq-len 1536 \
    --loader-threads 1 --recompute none --checkpoint-write "$1" --keep-checkpoints 1 \
    --out "$out" >/dev/null 2>"$out.log" || { cat "$out.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 - "$out" "$start" "$end" "$1" <<'PY'
import json, sys
out, start, end, mode = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
steps = [json.loads(line)["step_time_s"] for line in open(f"{out}/metrics.jsonl")]
rss = int(open(f"{out}.rss").read().split()[-1]) / 1024**2
wall = end - start
print(f"{mode:5s} wall {wall:6.1f} s, steps {sum(steps):6.1f} s, rest {wall - sum(steps):5.1f} s, "
      f"peak RSS {rss:.1f} GB; steps {[round(s, 2) for s in steps]}", file=sys.stderr)
print(f"{mode} {wall:.2f}")
PY
  rm -rf "$out" "$out.log" # 2.3 GB a checkpoint
}

results=()
for round in $(seq 1 "$ROUNDS"); do
  results+=("$(one_run sync "sync-$round")")
  results+=("$(one_run async "async-$round")")
done
printf '%s\n' "${results[@]}" | python3 -c '
import statistics as st, sys
walls = {}
for line in sys.stdin:
    mode, wall = line.split()
    walls.setdefault(mode, []).append(float(wall))
s, a = st.median(walls["sync"]), st.median(walls["async"])
n = len(walls["sync"])
print(f"RATIO async/sync median wall {a / s:.2f} ({a:.1f} s / {s:.1f} s, {n} rounds)")
'
