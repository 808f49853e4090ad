# parallel-lab: one entry point.  make quick | make run | make ui | make test | make lint
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install quick run test test-fast lint ui lock docker-setup clean

install: $(VENV)/.installed

# The lock pins every package; reinstall only when it (or the project metadata) changes.
$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

quick: install  ## a first result in minutes on any machine: params.yaml's `quick` settings
	$(PY) -m pipeline.quickstart

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
