# Every target creates what it needs; on a fresh machine `make demo` and
# `make test` are the only two commands a newcomer runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE := $(HOME)/.cache/metainfer
export PIP_CACHE_DIR ?= $(CACHE)/pip
export PYTHONSAFEPATH := 1
DEMO_DIR ?= build/demo

.PHONY: venv demo test unit integration lint crds cluster-up cluster-down assets clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

# The main job: build the bundled digits classifier and adapt it to this machine.
demo: venv
	$(BIN)/metainfer examples build build/examples
	$(BIN)/metainfer adapt build/examples/digits/model.onnx --data build/examples/digits/data.npz \
		--max-accuracy-drop 0.01 --budget-trials 24 --seed 0 --out $(DEMO_DIR)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

unit: venv
	$(BIN)/python -m pytest tests/unit

test: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest tests

clean:
	rm -rf build dist .pytest_cache
