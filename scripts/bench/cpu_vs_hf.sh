#!/usr/bin/env bash
# tessera vs the transformers baseline on the same CPU work (issue 12): stage 1 with Hub-shaped
# random-weight checkpoints (google/siglip-so400m-patch14-384 + Qwen/Qwen2.5-0.5B configs, bf16
# safetensors as the Hub ships them), 2 images and ~1,490 tokens per step, f32 (or bf16 with
# PRECISION=bf16), 2 threads.
# tessera trains on shards from `synth` + `ingest` (budget 1536: two image samples per step);
# scripts/baselines/hf_train_step.py gets the same images, tokens and supervised tokens per
# step (medians of tessera's metrics.jsonl). Runs alternate (tessera, transformers, tessera, ...)
# so machine load hits both alike; each run's first step is warm-up and left out.
#
# usage: scripts/bench/cpu_vs_hf.sh [ROUNDS]       (default 2 rounds; one command does everything)
# env:   STEPS=4            optimizer steps per run (the first is not counted)
#        SHAPE=real|small   small: the same Hub files with 4 layers per tower (quick iteration)
#        PRECISION=f32|bf16 bf16: tessera --precision bf16, the baseline --dtype bfloat16 (frozen
#                           towers bf16, projector f32 under autocast); sets the defaults below
#        TESSERA_ARGS="--recompute none"   flags for tessera (default: keep activations, as
#                           the baseline does without checkpointing)
#        BASELINE_ARGS=""   flags for the baseline (e.g. --ckpt for gradient checkpointing)
#        EXTRA_BIN=path     another tessera binary measured in the same rounds (a before/after)
#        TRAIN=lm|lm,vision full-parameter training (issue 20): tessera --stage 2 --train
#                           projector,lm[,vision], the baseline --train lm[,vision]
#        NPROC=1|2          tessera's ranks (peak RSS is per rank: /usr/bin/time on the launcher
#                           reports the largest child)
#        LM=qwen|qwen3|smollm2|qwen3moe  the language model (Hub-shaped): Qwen2.5-0.5B (default),
#                           Qwen3-0.6B-Base, SmolLM2-360M or Qwen3-30B-A3B's shapes with 2
#                           layers (make_hub_shaped_models.py's options;
#                           SmolLM2's shards are made with its family's tokenizer, the one of
#                           .deps/smollm2-135m-instruct, which gets <image> added)
#        BENCH=dir          where the baseline scripts are (default scripts/baselines, the
#                           repo's own: hf_train_step.py, make_hub_shaped_models.py); a folder
#                           with the older name hf_reference_step.py works too (e.g.
#                           BENCH=../shared/bench, the reference the repo's were compared with)
# Last line: "RATIO tessera/transformers median step <r> (<t> s / <h> s) ..." .
# Needs: target/release/tessera (cargo build --release) and a Python with torch 2.11 +
# transformers: .deps/hfvenv (scripts/setup/setup.sh makes it), else one made under data/hfvenv
# (git-ignored; network to PyPI the first time).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
STEPS=${STEPS:-4}
SHAPE=${SHAPE:-real}
PRECISION=${PRECISION:-f32}
case "$PRECISION" in
  f32) TESSERA_ARGS=${TESSERA_ARGS:---recompute none}; BASELINE_ARGS=${BASELINE_ARGS:-} ;;
  bf16) TESSERA_ARGS=${TESSERA_ARGS:---recompute none --precision bf16}
        BASELINE_ARGS=${BASELINE_ARGS:---dtype bfloat16} ;;
  *) echo "cpu_vs_hf: PRECISION must be f32 or bf16, not $PRECISION" >&2; exit 1 ;;
esac
TRAIN=${TRAIN:-}
NPROC=${NPROC:-1}
LM=${LM:-qwen}
case "$LM" in
  qwen|qwen3|smollm2|qwen3moe) ;;
  *) echo "cpu_vs_hf: LM must be qwen, qwen3, smollm2 or qwen3moe, not $LM" >&2; exit 1 ;;
esac
STAGE_ARGS=(--stage 1)
if [ -n "$TRAIN" ]; then
  STAGE_ARGS=(--stage 2 --train "projector,$TRAIN")
  BASELINE_ARGS="$BASELINE_ARGS --train $TRAIN"
fi
BENCH=${BENCH:-scripts/baselines}
HF_STEP=$BENCH/hf_train_step.py
[ -f "$HF_STEP" ] || HF_STEP=$BENCH/hf_reference_step.py
[ -f "$HF_STEP" ] || { echo "cpu_vs_hf: no hf_train_step.py in BENCH=$BENCH" >&2; exit 1; }
T=target/release/tessera
W=data/cpu_vs_hf
PY=data/hfvenv/bin/python
[ -x .deps/hfvenv/bin/python ] && PY=.deps/hfvenv/bin/python
mkdir -p "$W"
say() { echo "cpu_vs_hf: $*" >&2; }
[ -x "$T" ] || { say "build first: cargo build --release"; exit 1; }

# 1. python with torch + transformers (torch from .deps/venv, its CUDA libraries from PyPI)
if ! "$PY" -c 'import torch, transformers' 2>/dev/null; then
  say "making $PY (torch 2.11 + transformers)"
  bash scripts/setup/setup.sh >/dev/null
  python3 -m venv data/hfvenv
  site=$(.deps/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  pysite=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" > "$pysite/tessera_torch.pth"
  data/hfvenv/bin/pip install -q --disable-pip-version-check torch==2.11.0 transformers
fi

# 2. Hub-shaped checkpoints (2.6 GB) and, for SHAPE=small, 4-layer configs over the same files
if [ ! -f data/hub/qwen/model.safetensors ] || [ ! -f data/hub/siglip/model.safetensors ] \
    || [ ! -f "data/hub/$LM/model.safetensors" ]; then
  say "writing Hub-shaped checkpoints to data/hub"
  extra=()
  [ "$LM" = qwen ] || extra=("$LM")
  "$PY" "$BENCH/make_hub_shaped_models.py" data/hub "${extra[@]}"
fi
MODELS=data/hub
if [ "$SHAPE" = small ]; then
  # The first 4 layers of each tower: configs and weights (tessera refuses a checkpoint holding
  # tensors its config does not describe, so the weights are cut too, not linked whole).
  MODELS=data/hub_small
  "$PY" - "$MODELS" "$LM" <<'PY'
import json, os, re, sys
from safetensors.torch import load_file, save_file
out, lm = sys.argv[1], sys.argv[2]
for name in ("siglip", lm):
    os.makedirs(f"{out}/{name}", exist_ok=True)
    config = json.load(open(f"data/hub/{name}/config.json"))
    for tower in ([config["vision_config"], config["text_config"]] if name == "siglip" else [config]):
        tower["num_hidden_layers"] = 4
    json.dump(config, open(f"{out}/{name}/config.json", "w"), indent=2)
    layer = re.compile(r"\.layers\.(\d+)\.")
    kept = {k: v for k, v in load_file(f"data/hub/{name}/model.safetensors").items()
            if not (m := layer.search(k)) or int(m.group(1)) < 4}
    save_file(kept, f"{out}/{name}/model.safetensors", metadata={"format": "pt"})
PY
fi

# 3. shards: 64 LLaVA-Pretrain-shaped image samples (~16 caption tokens + 729 image tokens)
SHARDS=$W/shards TOKENIZER=.deps/tokenizer/tokenizer.json
if [ "$LM" = smollm2 ]; then SHARDS=$W/shards-smollm2 TOKENIZER=.deps/smollm2-135m-instruct/tokenizer.json; fi
if [ ! -f "$SHARDS/index.json" ]; then
  [ -f "$W/llava/blip_laion_cc_sbu_558k.json" ] \
    || "$T" synth --out "$W/llava" --samples 64 --text-only-fraction 0 --seed 1 >/dev/null 2>&1
  "$T" ingest --json "$W/llava/blip_laion_cc_sbu_558k.json" --images "$W/llava/images" \
    --tokenizer "$TOKENIZER" --out "$SHARDS" >/dev/null 2>&1
fi

export OMP_NUM_THREADS=2
tessera_run() { # BIN NAME ARGS... -> $W/NAME/{metrics.jsonl,rss}
  rm -rf "${W:?}/$2"
  /usr/bin/time -f %M -o "$W/$2.rss" "$1" train --quiet "${STAGE_ARGS[@]}" --shards "$SHARDS" \
    --vision "$MODELS/siglip" --lm "$MODELS/$LM" --nproc "$NPROC" --steps "$STEPS" \
    --token-budget 1536 --seq-len 1536 --loader-threads 1 --out "$W/$2" "${@:3}" >/dev/null
}
stat_of() { # NAME -> "median_step_s tokens supervised rss_mib" from metrics.jsonl
  python3 - "$W/$1/metrics.jsonl" "$W/$1.rss" <<'PY'
import json, statistics as st, sys
m = [json.loads(l) for l in open(sys.argv[1])][1:]
rss = int(open(sys.argv[2]).read().split()[-1]) / 1024
print(f"{st.median(x['step_time_s'] for x in m):.2f} {round(st.median(x['tokens'] for x in m))} "
      f"{round(st.median(x['supervised_tokens'] for x in m))} {rss:.0f}")
PY
}
baseline_run() { # TOKENS SUPERVISED -> "median_step_s rss_mib"
  local log="$W/baseline.log"
  "$PY" "$HF_STEP" "$MODELS/siglip" "$MODELS/$LM" --images 2 \
    --tokens "$1" --supervised "$2" --steps "$STEPS" --threads 2 $BASELINE_ARGS >"$log" 2>&1 \
    || { tail -5 "$log" >&2; exit 1; }
  python3 - "$log" <<'PY'
import re, statistics as st, sys
text = open(sys.argv[1]).read()
times = [float(t) for i, t in re.findall(r'^step (\d+): ([\d.]+)s', text, re.M) if int(i) > 0]
rss = re.search(r'maxrss (\d+) MiB', text).group(1)
print(f"{st.median(times):.2f} {rss}")
PY
}

declare -a TS HS XS
for r in $(seq 1 "$ROUNDS"); do
  tessera_run "$T" tessera $TESSERA_ARGS
  read -r t tokens sup trss < <(stat_of tessera)
  read -r h hrss < <(baseline_run "$tokens" "$sup")
  TS+=("$t"); HS+=("$h")
  line="round $r ($(uptime | sed 's/.*load average: //')): tessera $t s (rss $trss MiB) | transformers $h s (rss $hrss MiB) | $tokens tokens, $sup supervised"
  if [ -n "${EXTRA_BIN:-}" ]; then
    tessera_run "$EXTRA_BIN" extra
    read -r x _ _ xrss < <(stat_of extra)
    XS+=("$x")
    line="$line | extra $x s (rss $xrss MiB)"
  fi
  echo "$line"
done
python3 - "${TS[*]}" "${HS[*]}" "${XS[*]:-}" "$(lscpu | sed -n 's/^Model name: *//p')" "$TESSERA_ARGS" "$BASELINE_ARGS" "$PRECISION" "$LM" <<'PY'
import statistics as st, sys
t = st.median(map(float, sys.argv[1].split())); h = st.median(map(float, sys.argv[2].split()))
extra = f"; extra binary {st.median(map(float, sys.argv[3].split())) / h:.2f}" if sys.argv[3].strip() else ""
print(f"RATIO tessera/transformers median step {t / h:.2f} ({t:.2f} s / {h:.2f} s){extra}; "
      f"tessera [{sys.argv[5]}] baseline [{sys.argv[6]}]; {sys.argv[4]}, 2 threads, {sys.argv[7]}, "
      f"LM {sys.argv[8]}")
PY
