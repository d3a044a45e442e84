# pycni developer entry points. `make` builds the virtualenv; `make demo` and `make test` are the two
# commands in README.md.
SHELL := /bin/bash
PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all venv deps lint typecheck unit test demo bench driver bundle clean
all: venv

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "python3.12 not found (install it with pyenv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

# Debian packages the tests drive: reference plugins, the libcni sources, etcd, podman.
deps:
	bash .ci/apt-deps

driver: $(VENV)/bin/cnidriver
$(VENV)/bin/cnidriver: tests/e2e/driver/main.go | venv
	bash tests/e2e/driver/build.sh $@

# The frozen multicall bundle and the ready CNI_PATH dir dist/cni-bin (bundler/build.py).
bundle: venv
	$(PY) -m bundler.build

lint: venv
	$(VENV)/bin/ruff check cni ipam bundler tests
	$(VENV)/bin/mypy

unit: venv
	$(VENV)/bin/pytest -q tests/unit

test: deps venv driver lint
	$(VENV)/bin/pytest -q tests

demo: deps venv
	$(PY) -m tests.demo

bench: deps venv driver
	$(PY) -m tests.bench.macvlan

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
