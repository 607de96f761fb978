# lra-bench — every target sets up .venv itself, so `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export WANDB_MODE ?= offline
export HF_DATASETS_OFFLINE ?= 1
export HF_HUB_OFFLINE ?= 1
export PYTHONUNBUFFERED := 1

.DEFAULT_GOAL := help
.PHONY: help install test test-fast test-full demo lint format data bench approx results clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=python3)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first: any other torch spec pulls a multi-GB CUDA build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project (idempotent)

test: $(STAMP)  ## run the whole test suite (fast tier, then the slow tier)
	$(PY) -m pytest -q -m "not slow and not gpu"
	$(PY) -m pytest -q -m "slow and not gpu"

test-fast: $(STAMP)  ## the fast tier only
	$(PY) -m pytest -q -m "not slow and not gpu"

demo: $(STAMP)  ## quick ListOps run with GPA on generated data (CSV + offline W&B)
	$(PY) run.py experiment=demo

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

format: $(STAMP)  ## ruff format + import sort
	$(VENV)/bin/ruff check --fix .

data: $(STAMP)  ## check/prepare a task's data: make data TASK=listops
	$(PY) -m tasks.prepare task=$(or $(TASK),listops)

clean:  ## remove the venv, caches and run outputs
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
