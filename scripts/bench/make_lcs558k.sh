#!/usr/bin/env bash
# LLaVA-Pretrain at its real size, for the full-size ingest benchmark (scripts/bench/bench_ingest_558k.sh):
# OUT/blip_laion_cc_sbu_558k.json with 558,128 records in LCS-558K's layout (9-digit ids,
# `00000/000000123.jpg` paths, a human turn with <image> and a gpt caption) over the images of
# a `tessera synth --photos` dataset of IMAGES real photo crops (Debian's mate-backgrounds),
# each image file used by about 558128/IMAGES records so the disk stays small (IMAGES=15000:
# about 0.4 GB of images; the shards of an ingest of all records take about 16 GB). Also
# OUT/first_15000.json, the same job's first 15,000 records, and OUT/images -> base/images.
#
#   scripts/bench/make_lcs558k.sh OUT [IMAGES]        (RECORDS=558128, TESSERA=target/release/tessera)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: scripts/bench/make_lcs558k.sh OUT [IMAGES]}
IMAGES=${2:-15000}
RECORDS=${RECORDS:-558128}
T=${TESSERA:-target/release/tessera}
PHOTOS=${PHOTOS:-/usr/share/backgrounds/mate}
[ -x "$T" ] || { echo "make_lcs558k: no $T (cargo build --release first)" >&2; exit 1; }
[ -d "$PHOTOS" ] || { echo "make_lcs558k: no photos in $PHOTOS (scripts/setup/setup.sh installs mate-backgrounds)" >&2; exit 1; }
mkdir -p "$OUT"
if [ ! -f "$OUT/base/blip_laion_cc_sbu_558k.json" ]; then
  rm -rf "$OUT/base"
  NO_PROGRESS=1 "$T" synth --quiet --samples "$IMAGES" --photos "$PHOTOS" --seed 11 --out "$OUT/base"
fi
ln -sfn base/images "$OUT/images"
python3 - "$OUT" "$RECORDS" <<'PY'
import json, os, sys

out, records = sys.argv[1], int(sys.argv[2])
base = json.load(open(os.path.join(out, "base", "blip_laion_cc_sbu_558k.json")))
base = [r for r in base if r.get("image")]
# LCS-558K's human turns: one of a few instructions, with <image> before or after it.
asks = [
    "Render a clear and concise summary of the photo.",
    "Give a brief description of the image.",
    "Share a concise interpretation of the image provided.",
    "Describe the image concisely.",
    "Provide a brief description of the given image.",
]

def record(i):
    b = base[i % len(base)]
    ask = asks[i % len(asks)]
    human = f"{ask}\n<image>" if i % 3 else f"<image>\n{ask}"
    return {
        "id": f"{i:09d}",
        "image": b["image"],
        "conversations": [
            {"from": "human", "value": human},
            {"from": "gpt", "value": b["conversations"][-1]["value"]},
        ],
    }

def write(path, n):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("[")
        for i in range(n):
            if i:
                f.write(", ")
            f.write(json.dumps(record(i)))
        f.write("]")
    os.replace(tmp, path)

write(os.path.join(out, "blip_laion_cc_sbu_558k.json"), records)
write(os.path.join(out, "first_15000.json"), min(15000, records))
print(f"{out}: {records} records over {len(base)} image files")
PY
