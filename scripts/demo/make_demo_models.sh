#!/usr/bin/env bash
# Makes the demo's pretrained LM in demo-models/ (committed; run this only to remake it; the
# demo's vision tower is the real DINOv2-small that scripts/setup/setup.sh writes):
#   lm/      the tiny Qwen2 LM, compact form, by scripts/demo/pretrain_lm.py on synth's text alone
#   MANIFEST.json  each part's command, seeds, held-out scores, file sha256s, and the measures
#            (losses, an output norm, every tensor's norm) of a reduced-budget run with
#            --reproducible, which tests/demo_parts.rs reruns and compares within a tolerance
# The full runs use the fast (machine-dependent) kernels on 1 thread (2 threads crawled on a
# busy 2-core machine): another machine makes an LM as good but not the same bytes. About 15
# minutes on 2 shared cores.
# Usage: bash scripts/demo/make_demo_models.sh   (after scripts/setup/setup.sh and cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.deps/hfvenv/bin/python
OUT=demo-models
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -x target/release/tessera ] || { echo "make_demo_models: build tessera first" >&2; exit 1; }

# Seeds: none of the demo's (scripts/demo/demo.sh: 0 trains, 1 scores).
LM=(--seeds 200,201 --records 4000 --epochs 6 --held-out 400 --hidden 128 --layers 4
  --heads 4 --kv-heads 2 --batch 32 --lr 3e-3 --threads 1)
LM_REDUCED=(--seeds 200 --records 48 --epochs 1 --held-out 0 --hidden 128 --layers 4
  --heads 4 --kv-heads 2 --batch 16 --lr 3e-3 --reproducible)

"$PY" scripts/demo/pretrain_lm.py --out "$WORK/lm" "${LM[@]}" | tee "$WORK/lm.log"
"$PY" scripts/demo/pretrain_lm.py --out "$WORK/lm-reduced" "${LM_REDUCED[@]}" > "$WORK/lm-reduced.log"

rm -rf "$OUT/lm"
mkdir -p "$OUT"
cp -r "$WORK/lm" "$OUT/lm"
"$PY" scripts/demo/demo_manifest.py "$OUT" "$WORK/lm.log" "$WORK/lm-reduced.log"
echo "make_demo_models: wrote $OUT (lm/, MANIFEST.json)"
