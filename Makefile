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
.PHONY: help install test test-fast demo lint typecheck format configs data bench approx results reproduce clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

# Which torch wheel: default = PyPI's (on Linux x86-64 the CUDA build, ~2.5 GB with its nvidia-* packages: what a
# GPU machine needs); cpu = the CPU-only build from PyTorch's own index (~200 MB): make install TORCH=cpu.
TORCH ?= default
TORCH_INDEX_cpu := --index-url https://download.pytorch.org/whl/cpu
TORCH_INDEX_default :=
ifeq ($(filter $(TORCH),cpu default),)
$(error TORCH=$(TORCH): expected cpu or default)
endif

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or make PYTHON=python3)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, from the index TORCH chose; the project's own torch spec then accepts it as installed.
	$(PY) -m pip install -q "torch==2.13.0" $(TORCH_INDEX_$(TORCH))
	$(PY) -m pip install -q -e ".[dev]"
	# the compiled CPU kernels (a machine without a compiler runs their eager forms: one line, not an error)
	$(PY) -m models.kernels
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project (idempotent); TORCH=cpu: the CPU-only torch wheel

# Each tier on one pytest-xdist worker per logical CPU (at most 4: the slow tests each start run.py processes);
# the SLURM tests share one worker (tests/conftest.py). PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= logical
PYTEST := $(PY) -m pytest -q --durations=30 -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadgroup

test: $(STAMP)  ## run the whole test suite (fast tier, then the slow tier)
	$(PYTEST) -m "not slow and not gpu"
	$(PYTEST) -m "slow and not gpu"

test-fast: $(STAMP)  ## the fast tier only
	$(PYTEST) -m "not slow and not gpu"

DEMO_ARGS ?=
demo: $(STAMP)  ## GPA on generated ListOps of 32–128 tokens (experiment=cpu_small; CSV + offline W&B); DEMO_ARGS='key=value …' adds overrides
	$(PY) run.py experiment=demo $(DEMO_ARGS)

lint: $(STAMP)  ## ruff
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)  ## mypy on lra_bench, models, tasks (settings in pyproject.toml)
	$(VENV)/bin/mypy

format: $(STAMP)  ## ruff format + import sort
	$(VENV)/bin/ruff check --fix .

configs: $(STAMP)  ## write conf/attn/ and conf/selector/ from the components' config dataclasses (tests check they match)
	$(PY) -m lra_bench.config.generate

data: $(STAMP)  ## check/prepare a task's data: make data TASK=listops
	$(PY) -m lra_bench.prepare task=$(or $(TASK),listops)

# --- attention benchmark, approximation study, docs/results.md ------------------------------------------------
BENCH_ARGS  ?=
APPROX_ARGS ?=
RESULTS_DIR ?= outputs/results
# The CPU report's settings (docs/results.md says why): B=2 and one torch thread — the 2 cores are shared, and
# two OpenMP threads on a loaded machine stall each other (SVD 25× slower, timings erratic).
BENCH_REPORT  ?= batch_size=2 threads=1 warmup=1 repeats=7 min_repeats=3 max_time_s=20 profile.steps=1
APPROX_REPORT ?= threads=1
# The committed training-step measurements (`python -m lra_bench.bench.step --json …`), newest first by name: the page
# renders them again (hours to remake, so they are not rerun here).
STEP_JSONS := $(sort $(wildcard docs/results/train_step/*.json))
# A trained checkpoint for the approx study's `trained` source: default = the newest last.ckpt under outputs/, at any
# depth (a reproduction's sits in outputs/reproductions/<protocol>/<task>/<attn>/seed-<s>/checkpoints/).
APPROX_CKPT ?= $(shell find outputs -path '*/checkpoints/last.ckpt' -printf '%T@ %p\n' 2>/dev/null | sort -nr | head -1 | cut -d' ' -f2-)

bench: $(STAMP)  ## attention speed/memory sweep → outputs/bench/<time>/ (BENCH_ARGS='key=value …')
	$(PY) -m lra_bench.bench $(BENCH_ARGS)

approx: $(STAMP)  ## approximation study → outputs/approx/<time>/ (APPROX_ARGS='ckpt=<run>/checkpoints/last.ckpt …')
	$(PY) -m lra_bench.approx $(APPROX_ARGS)

results: $(STAMP)  ## rerun the CPU bench + approx study (~10-25 min on 2 shared cores), regenerate docs/results.md
	$(PY) -m lra_bench.bench $(BENCH_REPORT) $(BENCH_ARGS) hydra.run.dir=$(RESULTS_DIR)/bench
	$(PY) -m lra_bench.approx $(APPROX_REPORT) $(if $(APPROX_CKPT),ckpt=$(APPROX_CKPT) model.data_dir=$(RESULTS_DIR)/data) \
		$(APPROX_ARGS) hydra.run.dir=$(RESULTS_DIR)/approx
	$(PY) -m lra_bench.reports.results_doc --bench $(RESULTS_DIR)/bench --approx $(RESULTS_DIR)/approx --out docs/results.md \
		$(addprefix --step ,$(STEP_JSONS))

TASK ?= listops
ATTN ?= nystrom
SEED ?= 0
PROTOCOL ?= nystromformer
REPRODUCE_ARGS ?=
reproduce: $(STAMP)  ## one faithful protocol run kept as evidence in reproductions/: make reproduce TASK=listops ATTN=nystrom SEED=0
	$(PY) -m lra_bench.reproduce --task $(TASK) --attn $(ATTN) --seed $(SEED) --protocol $(PROTOCOL) $(REPRODUCE_ARGS)

clean:  ## remove the venv, caches and run outputs
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
