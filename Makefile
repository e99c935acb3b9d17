# The two commands of the README, plus benchmarks. Each runs scripts/setup/setup.sh first
# (idempotent: about a second when everything is installed).
CARGO ?= cargo
DEMO_DIR ?= runs/demo

.PHONY: setup demo test lint bench build fmt

setup:
	@bash scripts/setup/setup.sh

build: setup
	$(CARGO) build --release

demo: build
	@bash scripts/demo/demo.sh "$(DEMO_DIR)"

# Every test of the workspace, built once in release mode. `make lint` (CI runs both) is the
# static checks: clippy, and the no-libtorch CLI as a `cargo check` (it writes no binary, so it
# cannot replace the train-capable target/release/tessera the tests run). Tests and lints both
# build with the test hooks (TEST_FEATURES: the crash-safety tests pause a checkpoint write
# through TESSERA_CHECKPOINT_PAUSE_AT), so neither rebuilds what the other built; `make build`
# and `make demo` leave the hooks out. `--no-fail-fast`: a failing test binary does not hide the
# results of the ones after it.
TEST_FEATURES ?= --features test-hooks

# The build starts once what compiling needs is installed, and the rest of the set-up (Python
# environments, the real pretrained parts, moto) installs beside it: on a fresh 2-core machine
# that is minutes the build no longer waits for.
test:
	@bash scripts/setup/setup.sh build
	@bash scripts/setup/beside_build.sh \
	  $(CARGO) test --release --workspace --no-fail-fast $(TEST_FEATURES) --no-run
	$(CARGO) test --release --workspace --no-fail-fast $(TEST_FEATURES)

lint: setup
	$(CARGO) clippy --release --workspace --all-targets $(TEST_FEATURES) -- -D warnings
	$(CARGO) check --release --no-default-features --bin tessera

bench: build
	@bash scripts/bench/bench.sh

fmt:
	$(CARGO) fmt --all
