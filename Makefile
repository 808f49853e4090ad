# parallel-lab: one entry point. `make` alone lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The venv's commands (dvc, mlflow) come first; abspath, so that an absolute VENV works too.
VENV_BIN := $(abspath $(VENV))/bin
# PATH without the venv, taken before the export below (an activated venv's entry dropped too):
# where gpu-check's fallback finds the machine's own python3, since on the exported PATH
# python3 is the venv's, which may be half made and lack torch.
OUTSIDE_VENV_PATH := $(subst $(VENV_BIN):,,$(PATH))
export PATH := $(VENV_BIN):$(PATH)

.PHONY: help install horovod quick run test test-fast lint peer-install gpu-check gpu-wheels need-DIR compose docker-quick ui lock docker-setup clean
.DEFAULT_GOAL := help

help:  ## this list
	@echo "parallel-lab: which PyTorch parallel strategy, at what cost (README.md)"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  make quick ARGS=\"devices=cpu train.epochs=1\"   passes key=value overrides"

# HOROVOD=1: Horovod too, for the opt-in `horovod` strategy (make horovod, below)
HOROVOD ?=
install: $(VENV)/.installed $(if $(filter 1,$(HOROVOD)),horovod)  ## the pinned environment in .venv (about 6 GB, a minute or two; TORCH_CUDA=cu126 for NVIDIA drivers 525-579; HOROVOD=1 adds Horovod)

# What the install needs, each missing piece said in one line before anything is written.
PREREQS := python3 -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v >= (3, 11) else \
	"error: Python 3.11 or newer is needed; python3 is %d.%d" % v)' && \
	{ python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "error: python3 has no \
	venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 2; }; } && \
	{ free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); [ "$$free" -ge 8 ] || \
	{ echo "error: $$free GiB free in $(CURDIR); the pinned environment needs about 8 GiB" >&2; \
	exit 2; }; }

# Which build of the lock's torch and torchvision .venv gets (docs/docker.md "Older drivers"): cu130,
# the lock as it is (PyPI's torch, built for CUDA 13.0: NVIDIA driver 580 or newer), or cu126,
# the same versions from PyTorch's CUDA 12.6 index (driver 525 or newer), whose own metadata
# pins the CUDA 12 wheels it pulls. The stamp records the build, so later targets keep it;
# naming the other one starts .venv afresh, as pip takes 2.14.1+cu126 for torch==2.14.1 and
# would keep the old build.
TORCH_CUDAS := cu130 cu126
INSTALLED_CUDA := $(if $(wildcard $(VENV)/.installed),$(or $(shell cat $(VENV)/.installed),cu130))
TORCH_CUDA ?= $(or $(INSTALLED_CUDA),cu130)
SWITCH_CUDA := $(filter-out $(TORCH_CUDA),$(INSTALLED_CUDA))
TORCH_CUDA_OK := $(and $(filter 1,$(words $(TORCH_CUDA))),$(filter $(TORCH_CUDA),$(TORCH_CUDAS)))
CHECK_TORCH_CUDA := $(if $(TORCH_CUDA_OK),true,echo "error: TORCH_CUDA=$(TORCH_CUDA): expected \
	cu130 (the default: PyPI's torch for CUDA 13.0, NVIDIA driver 580 or newer) or cu126 \
	(torch for CUDA 12.6, driver 525 or newer)" >&2; exit 2)
TORCH_PINS := $(shell grep -E '^(torch|torchvision)==' requirements.lock)
INSTALL_cu130 := $(PY) -m pip install --quiet -r requirements.lock
INSTALL_cu126 := { grep -v -E '^(torch|torchvision|triton|cuda-[a-z-]+|nvidia-[a-z0-9-]+)==' \
	requirements.lock; grep -E '^nvidia-ml-py==' requirements.lock; } > $(VENV)/lock-cu126.txt && \
	$(PY) -m pip install --quiet -r $(VENV)/lock-cu126.txt && \
	$(PY) -m pip install --quiet --index-url https://download.pytorch.org/whl/cu126 \
	$(addsuffix +cu126,$(TORCH_PINS))

# The lock pins every package; reinstall only when it (or the project metadata) changes, or
# another TORCH_CUDA is named.
$(VENV)/.installed: requirements.lock pyproject.toml $(if $(SWITCH_CUDA),FORCE)
	@$(CHECK_TORCH_CUDA)
	@$(PREREQS)
	$(if $(SWITCH_CUDA),python3 -m venv --clear $(VENV),test -x $(PY) || python3 -m venv $(VENV))
	$(PY) -m pip install --quiet $(shell grep -E '^pip==' requirements.lock)
	$(INSTALL_$(TORCH_CUDA))
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	echo $(TORCH_CUDA) > $@

FORCE:

# Horovod 0.28.1, the `horovod` strategy's, never on the default path (docs/horovod.md): its
# pinned sdist built with two one-line C++ standard changes (6 minutes on 2 cores), the wheel
# cached in .cache/horovod/ by its inputs (a second install takes seconds); a missing cmake or
# C++ compiler is one line
horovod: $(VENV)/.installed  ## Horovod for the opt-in `horovod` strategy, built from its sdist and cached (= make install HOROVOD=1)
	$(PY) deploy/horovod/build_wheel.py --install

quick: install  ## a first result in minutes on any machine (params.yaml's `quick`; ARGS=key=value ...)
	$(PY) -m pipeline.quickstart $(ARGS)

# With ARGS, the overrides go through `dvc exp run -S`: DVC's way to try values, recorded as
# an experiment (`dvc exp show`), since `dvc repro` reads params.yaml alone.
run: install  ## the full experiment: fetch -> train every strategy -> compare, then MLflow (ARGS=key=value ...)
	$(if $(strip $(ARGS)),dvc exp run $(foreach a,$(ARGS),-S '$(a)'),dvc repro)
	$(PY) -m pipeline.publish

# The full experiment as the README's container command runs it: PostgreSQL, the MLflow
# server and the pipeline (`dvc repro` on every GPU, then the runs pushed to MLflow); returns
# with the pipeline's exit code and leaves MLflow up (`docker compose down` stops it).
# DEVICE=cpu runs the CPU variant (no NVIDIA runtime needed; the full experiment on a CPU
# takes a day: `make docker-quick` is the quick look).
COMPOSE_SERVICE = $(if $(filter cpu,$(DEVICE)),--profile cpu up --build --exit-code-from pipeline-cpu pipeline-cpu,up --build --exit-code-from pipeline pipeline)
compose:  ## the full experiment in the container, PostgreSQL and MLflow beside it (DEVICE=cpu without a GPU)
	test -f .env || cp .env.example .env
	$(COMPOSE) $(COMPOSE_SERVICE)

# `make quick` with nothing installed but Docker: the CPU container, with PostgreSQL and the
# MLflow server beside it (UI on http://127.0.0.1:5000). `run` starts them and returns with
# the quickstart's exit code; they keep running for the UI (`docker compose down` stops them).
COMPOSE ?= docker compose
docker-quick:  ## make quick in the CPU container, MLflow server and all (Docker only; ARGS=key=value ...)
	test -f .env || cp .env.example .env
	$(COMPOSE) --profile cpu build pipeline-cpu mlflow
	$(COMPOSE) --profile cpu run --rm pipeline-cpu python -m pipeline.quickstart $(ARGS)

# Two workers: most of a test's time is single-threaded process start-up, so two cores run
# two tests at once; each e2e module stays on one worker, the longest handed out first
# (tests/conftest.py).
PYTEST := $(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder

test: install  ## every test, as CI runs it (CPU; see docs/testing.md for what it needs)
	$(PYTEST)

test-fast: install  ## tests/unit: pure functions and single-process tests, under 3 minutes
	$(PYTEST) tests/unit

lint: install  ## ruff (lint and format check) and mypy over the package, the benchmarks and tools/
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The pyproject's `peer` extra (its pins read from there, the one list) into .venv, the lock
# as constraints so no pinned package moves; requirements.lock never holds them
peer-install: install  ## Lightning for benchmarks/peer.py (optional; the pipeline never needs it)
	$(PY) -m pip install --quiet -c requirements.lock $(shell $(PY) -c 'import tomllib; \
		print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"] \
		["optional-dependencies"]["peer"]))')

# gpu-check runs where GPU time is short and there may be no network: with the pinned
# environment when it installs (one quick try), else with the machine's own python3 and torch
# (the JSON records which; python3 as found outside the venv), plus wheels carried in WHEELS
# for what that python lacks (make gpu-wheels fetches them).
# (through SUBMAKE: a recipe naming $(MAKE) itself would run even under `make -n`)
SUBMAKE = $(MAKE) --no-print-directory
DEVICE ?= cuda
WHEELS ?=
gpu-check:  ## prove and time every strategy on one GPU in minutes; JSON in benchmarks/results (DEVICE=cpu: tiny; WHEELS=dir)
	@if PIP_RETRIES=0 PIP_TIMEOUT=10 $(SUBMAKE) install >/dev/null 2>&1; then \
		py=$(PY); \
	else \
		py=$$(PATH='$(OUTSIDE_VENV_PATH)'; command -v python3) || { \
			echo "gpu-check: the pinned environment does not install here, and there is no" \
				"python3 outside $(VENV)" >&2; exit 2; }; \
		echo "gpu-check: the pinned environment does not install here (make install says why);" \
			"using $$py and its own torch" >&2; \
		if [ -n "$(WHEELS)" ]; then \
			$$py -m pip install -q --no-index --no-deps --upgrade --target .gpu-site \
				$(WHEELS)/*.whl || exit 2; \
			export PYTHONPATH=$(CURDIR)/.gpu-site; \
		fi; \
	fi; \
	$$py -m benchmarks.gpu_check --device $(DEVICE)

# The WHEELS for gpu-check on a machine without network (python3 3.12 with its own CUDA torch):
# what gpu-check imports beyond that, at the lock's pins (benchmarks/gpu_wheels.py says which
# and why). Run where PyPI is reachable, then carry DIR over. DIR is checked before the install.
DIR ?=
gpu-wheels: $(if $(DIR),install,need-DIR)  ## download into DIR the wheels gpu-check needs on a GPU machine without network
	$(PY) -m benchmarks.gpu_wheels --download $(DIR)

need-DIR:
	@echo "error: make gpu-wheels DIR=<directory>: where to put the wheels" >&2; exit 2

ui: install  ## MLflow UI on the embedded store: http://127.0.0.1:5000
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

lock:  ## re-resolve requirements.lock from pyproject.toml's pins
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[test]'
	.lock-venv/bin/pip freeze --all --exclude-editable | grep -v '^parallel-lab' > requirements.lock
	rm -rf .lock-venv

docker-setup: install  ## Docker for the container tests: engine, pinned tools, stand-in base images (root: apt, dockerd)
	$(PY) docker/standins/build.py all

clean:
	rm -rf results reports data mlflow.db mlruns checkpoints
