# `make demo` and `make test` each set up everything on a fresh machine first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hotrod-installed

.PHONY: demo test test-ray bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch, pinned: an unpinned torch would pull gigabytes of CUDA packages.
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hotrod demo

test: $(STAMP)
	$(BIN)/python -m pytest

# Ray Serve is large and optional: its own step installs it, then runs the loopback-cluster tests.
test-ray: $(STAMP)
	$(BIN)/pip install -q -e ".[ray]"
	$(BIN)/python -m pytest tests/serve/test_ray.py

bench: $(STAMP)
	$(BIN)/python benchmarks/core.py

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
