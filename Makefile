# parallel-lab: one entry point.  make run | make test | make ui | make lock
VENV   ?= .venv
PY     := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test ui lock clean

install: $(VENV)/.installed

# The lock pins every package; reinstall only when it (or the project metadata) changes.
$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

run: install  ## the whole pipeline: fetch -> train every strategy -> compare
	dvc repro

test: install  ## the test suite (CPU, a few minutes)
	$(PY) -m pytest

ui: install  ## MLflow UI on the embedded store: http://127.0.0.1:5000
	mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

lock:  ## re-resolve requirements.lock from pyproject.toml's pins
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -e '.[test]'
	.lock-venv/bin/pip freeze --exclude-editable | grep -v '^parallel-lab' > requirements.lock
	rm -rf .lock-venv

clean:
	rm -rf results reports data mlflow.db mlruns

.PHONY: docker-setup
docker-setup: install  ## Docker for the container tests: engine, pinned tools, stand-in base images (root: apt, dockerd)
	$(PY) docker/standins/build.py all
