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

test: setup
	$(CARGO) test --release --workspace
	$(CARGO) build --release --no-default-features

bench: build
	@bash scripts/bench.sh

fmt:
	$(CARGO) fmt --all
