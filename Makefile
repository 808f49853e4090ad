# parallel-lab: one entry point. `make` alone lists the targets.
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help install quick run test test-fast lint ui lock docker-setup clean
.DEFAULT_GOAL := help

help:  ## this list
	@echo "parallel-lab: which PyTorch parallel strategy, at what cost (README.md)"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  make quick ARGS=\"devices=cpu train.epochs=1\"   passes key=value overrides"

install: $(VENV)/.installed  ## the pinned environment in .venv (about 6 GB, a minute or two)

# What the install needs, each missing piece said in one line before anything is written.
PREREQS := python3 -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v >= (3, 11) else \
	"error: Python 3.11 or newer is needed; python3 is %d.%d" % v)' && \
	{ python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "error: python3 has no \
	venv module (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 2; }; } && \
	{ free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); [ "$$free" -ge 8 ] || \
	{ echo "error: $$free GiB free in $(CURDIR); the pinned environment needs about 8 GiB" >&2; \
	exit 2; }; }

# The lock pins every package; reinstall only when it (or the project metadata) changes.
$(VENV)/.installed: requirements.lock pyproject.toml
	@$(PREREQS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

quick: install  ## a first result in minutes on any machine (params.yaml's `quick`; ARGS=key=value ...)
	$(PY) -m pipeline.quickstart $(ARGS)

run: install  ## the full experiment: fetch -> train every strategy -> compare, then MLflow
	dvc repro
	$(PY) -m pipeline.publish

# Two workers: most of a test's time is single-threaded process start-up, so two cores run
# two tests at once; each e2e module stays on one worker, the longest handed out first
# (tests/conftest.py).
PYTEST := $(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder

test: install  ## every test, as CI runs it (CPU; see README "Tests" for what it needs)
	$(PYTEST)

test-fast: install  ## tests/unit: pure functions and single-process tests, under 3 minutes
	$(PYTEST) tests/unit

lint: install  ## ruff (lint and format check) and mypy over the package and the benchmarks
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

ui: install  ## MLflow UI on the embedded store: http://127.0.0.1:5000
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

lock:  ## re-resolve requirements.lock from pyproject.toml's pins
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[test]'
	.lock-venv/bin/pip freeze --exclude-editable | grep -v '^parallel-lab' > requirements.lock
	rm -rf .lock-venv

docker-setup: install  ## Docker for the container tests: engine, pinned tools, stand-in base images (root: apt, dockerd)
	$(PY) docker/standins/build.py all

clean:
	rm -rf results reports data mlflow.db mlruns checkpoints
