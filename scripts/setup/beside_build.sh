#!/usr/bin/env bash
# Runs the whole set-up (scripts/setup/setup.sh) in the background while COMMAND builds, then
# waits for both: on a fresh machine the set-up's downloads and conversions (transformers and
# torch's runtime libraries, SmolLM2 and DINOv2, moto, the tokenizer) take minutes that the
# build (the CPUs' work) would otherwise wait for. What compiling itself needs
# (`setup.sh build`: libtorch, gloo's and libjpeg's headers, and the other Debian packages) must
# be in place first.
# Fails when either fails: the set-up's log is printed when the set-up did. Interrupted, it stops
# the set-up too.
# Usage: bash scripts/setup/beside_build.sh COMMAND [ARGS...]   (run from anywhere)
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps
log=.deps/setup-beside-build.log
# Its own process group (setsid), so that an interrupted `make test` (Ctrl-C, a CI timeout)
# stops the set-up and whatever it runs (pip, a conversion) instead of leaving them behind.
setsid bash scripts/setup/setup.sh > "$log" 2>&1 &
setup_pid=$!
trap 'kill -TERM -- -"$setup_pid" 2>/dev/null; echo "beside_build: interrupted; the set-up stopped" >&2; exit 130' INT TERM HUP
"$@"
built=$?
wait "$setup_pid"
set_up=$?
if [ "$set_up" -ne 0 ]; then
  echo "beside_build: scripts/setup/setup.sh failed (exit $set_up); its log ($log):" >&2
  cat "$log" >&2
  exit "$set_up"
fi
# What it installed, if anything (a machine already set up logs nothing).
[ -s "$log" ] && sed 's/^/  /' "$log" >&2
exit "$built"
