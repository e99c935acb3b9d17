# The two commands of the README, plus benchmarks. Each runs scripts/setup.sh first
# (idempotent: about a second when everything is installed).
CARGO ?= cargo
DEMO_DIR ?= runs/demo

.PHONY: setup demo test bench build fmt

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release

demo: build
	@bash scripts/demo.sh "$(DEMO_DIR)"

# The no-libtorch build is checked first: building it replaces target/release/tessera, and
# the tests that run the binary need the full one that `cargo test` builds after it.
test: setup
	$(CARGO) build --release --no-default-features
	$(CARGO) test --release --workspace

bench: build
	@bash scripts/bench.sh

fmt:
	$(CARGO) fmt --all
