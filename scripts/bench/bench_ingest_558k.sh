#!/usr/bin/env bash
# LLaVA-Pretrain's full size through `tessera ingest`, against the same job at 15,000 records
# and against the repo's Python reference ingest (scripts/baselines/ingest_reference.py: same
# checks, same tokenizer, 2 processes), interleaved in one run so that a shared machine's load
# hits both alike; then a kill half way through the full job and a --resume that must end with
# byte-identical shards (their sha256s in index.json equal the uninterrupted run's).
#
#   scripts/bench/make_lcs558k.sh DATA                       # once: the json and the images
#   scripts/bench/bench_ingest_558k.sh DATA [ROUNDS] [WORK]  # ROUNDS=1; WORK: scratch (~17 GB)
#
# Each job's line: wall seconds, records/s, peak RSS (/usr/bin/time's maximum resident set),
# CPU seconds. The last line is one JSON object with every figure and the ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?usage: scripts/bench/bench_ingest_558k.sh DATA [ROUNDS] [WORK]}
ROUNDS=${2:-1}
WORK=${3:-$(mktemp -d)}
T=${TESSERA:-target/release/tessera}
PY=${PYTHON:-.deps/hfvenv/bin/python}
TOK=${TOKENIZER:-.deps/tokenizer/tokenizer.json}
WORKERS=${WORKERS:-2}
FULL=$DATA/blip_laion_cc_sbu_558k.json
SMALL=$DATA/first_15000.json
for f in "$T" "$PY" "$TOK" "$FULL" "$SMALL"; do
  [ -e "$f" ] || { echo "bench_ingest_558k: $f is missing" >&2; exit 1; }
done
mkdir -p "$WORK"
results=$WORK/results.jsonl
: > "$results"

# run NAME RECORDS COMMAND...: times COMMAND, appends its figures to results.jsonl.
run() {
  local name=$1 records=$2
  shift 2
  local log=$WORK/$name.time
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -v "$@" > "$WORK/$name.out" 2> "$log" || { cat "$log" >&2; exit 1; }
  python3 - "$name" "$records" "$log" "$load" >> "$results" <<'PY'
import json, re, sys
name, records, log, load = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read(), sys.argv[4]
def field(label):
    return re.search(re.escape(label) + r":\s*(\S+)", log).group(1)
wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall)))
cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
rss = int(field("Maximum resident set size (kbytes)")) / 1024
print(json.dumps({"job": name, "records": records, "seconds": round(seconds, 1),
                  "records_per_s": round(records / seconds), "peak_rss_mib": round(rss),
                  "cpu_s": round(cpu, 1), "cpu_us_per_record": round(cpu / records * 1e6),
                  "load_before": float(load)}))
PY
  tail -n 1 "$results"
}

tessera_cmd() { # OUT JSON
  echo env NO_PROGRESS=1 "$T" ingest --quiet --json "$2" --images "$DATA/images" \
    --tokenizer "$TOK" --out "$1" --workers "$WORKERS"
}
reference_cmd() { # OUT JSON
  echo "$PY" scripts/baselines/ingest_reference.py --json "$2" --images "$DATA/images" \
    --tokenizer "$TOK" --out "$1" --workers "$WORKERS"
}

count() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$1"; }
full_records=$(count "$FULL")
small_records=$(count "$SMALL")
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK/t15" "$WORK/r15" "$WORK/t558" "$WORK/r558"
  # shellcheck disable=SC2046 # the commands are word lists of paths without spaces
  run "tessera_15k_$round" "$small_records" $(tessera_cmd "$WORK/t15" "$SMALL")
  run "reference_15k_$round" "$small_records" $(reference_cmd "$WORK/r15" "$SMALL")
  rm -rf "$WORK/t15" "$WORK/r15"
  run "tessera_558k_$round" "$full_records" $(tessera_cmd "$WORK/t558" "$FULL")
  cp "$WORK/t558/index.json" "$WORK/index_uninterrupted.json"
  rm -rf "$WORK/t558"
  run "reference_558k_$round" "$full_records" $(reference_cmd "$WORK/r558" "$FULL")
  rm -rf "$WORK/r558"
done

# Killed half way (SIGKILL once the journal says half the records are written), then resumed.
shards_total=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["shards"]))' "$WORK/index_uninterrupted.json")
rm -rf "$WORK/resumed"
NO_PROGRESS=1 "$T" ingest --quiet --json "$FULL" --images "$DATA/images" --tokenizer "$TOK" \
  --out "$WORK/resumed" --workers "$WORKERS" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  done_shards=$(ls "$WORK/resumed" 2>/dev/null | grep -c '^shard-.*\.parquet$' || true)
  if [ "$done_shards" -ge $((shards_total / 2)) ]; then
    kill -9 "$pid"
    break
  fi
  sleep 0.5
done
wait "$pid" 2>/dev/null || true
echo "killed with $(ls "$WORK/resumed" | grep -c '^shard-.*\.parquet$') of $shards_total shards written" >&2
# shellcheck disable=SC2046
run "tessera_558k_resume" "$full_records" $(tessera_cmd "$WORK/resumed" "$FULL") --resume
python3 - "$WORK/index_uninterrupted.json" "$WORK/resumed/index.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sa = [(s["file"], s["sha256"]) for s in a["shards"]]
sb = [(s["file"], s["sha256"]) for s in b["shards"]]
assert sa == sb, "the resumed ingest's shards differ from the uninterrupted ones"
print(f"resume: {len(sb)} shards, byte-identical (sha256) to the uninterrupted run", file=sys.stderr)
PY
rm -rf "$WORK/resumed"

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(prefix, key):
    vals = [r[key] for r in rows if r["job"].startswith(prefix) and not r["job"].endswith("resume")]
    return statistics.median(vals)
out = {
    "tessera_558k_s": med("tessera_558k", "seconds"),
    "reference_558k_s": med("reference_558k", "seconds"),
    "tessera_15k_s": med("tessera_15k", "seconds"),
    "reference_15k_s": med("reference_15k", "seconds"),
    "tessera_558k_records_per_s": med("tessera_558k", "records_per_s"),
    "tessera_558k_peak_rss_mib": med("tessera_558k", "peak_rss_mib"),
    "tessera_15k_peak_rss_mib": med("tessera_15k", "peak_rss_mib"),
    "tessera_558k_cpu_us_per_record": med("tessera_558k", "cpu_us_per_record"),
    "reference_558k_cpu_us_per_record": med("reference_558k", "cpu_us_per_record"),
}
out["time_vs_reference_558k"] = round(out["tessera_558k_s"] / out["reference_558k_s"], 3)
out["time_vs_reference_15k"] = round(out["tessera_15k_s"] / out["reference_15k_s"], 3)
out["peak_rss_558k_vs_15k"] = round(out["tessera_558k_peak_rss_mib"] / out["tessera_15k_peak_rss_mib"], 3)
def records(prefix):
    return next(r["records"] for r in rows if r["job"].startswith(prefix))
out["seconds_per_record_558k_vs_15k"] = round(
    (out["tessera_558k_s"] / records("tessera_558k")) / (out["tessera_15k_s"] / records("tessera_15k")), 3)
print(json.dumps(out))
PY
