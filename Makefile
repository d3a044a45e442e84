# pycni developer entry points. `make` builds the virtualenv; `make demo` and `make test` are the two
# commands in README.md.
SHELL := /bin/bash
PYTHON ?= $(firstword $(wildcard /root/.pyenv/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null))
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all venv lock check-repro deps lint typecheck unit e2e test demo bench bench-bundle bench-ipam bench-ipam-scale bench-pool-fill bench-warm bench-rail bench-cluster bench-thick driver bundle image clean fuzz
all: venv

# Every dependency, runtime, build and dev, is installed from the locks (exact versions and sha256
# hashes; README.md "Locked dependencies"), then the project itself without its dependencies and without
# build isolation (an isolated build would fetch an unlocked setuptools). Whatever the lock does not name
# is uninstalled, so the virtualenv (and with it what PyInstaller can freeze) is exactly the lock.
LOCK := bundler/requirements.lock
DEV_LOCK := bundler/requirements-dev.lock
$(STAMP): pyproject.toml $(LOCK) $(DEV_LOCK)
	@test -n "$(PYTHON)" || { echo "python3.12 not found (install it with pyenv)"; exit 1; }
	rm -f $@
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes -r $(DEV_LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m bundler.lock extraneous $(DEV_LOCK) | xargs -r $(PY) -m pip uninstall -q -y
	touch $@

venv: $(STAMP)

# Re-resolve the locks from pyproject.toml (after changing a dependency there; UPGRADE=1 takes the newest
# versions the ranges allow, otherwise what is locked stays unless it must move). uv itself is locked in
# the dev lock. Pinned to the targets: CPython 3.12 on linux x86_64, whatever machine runs it.
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --no-header --python-version 3.12 \
	--python-platform x86_64-unknown-linux-gnu $(if $(UPGRADE),--upgrade)
# Each lock is written beside itself, seeded with the current one (uv keeps the versions pinned in its
# output file), and renamed over it only when it changed: atomic, and an unchanged lock keeps its mtime,
# so `make venv` does not re-run for nothing.
lock: venv
	cp $(LOCK) $(LOCK).new
	$(UV_COMPILE) pyproject.toml --extra build -o $(LOCK).new
	cmp -s $(LOCK).new $(LOCK) && rm $(LOCK).new || mv $(LOCK).new $(LOCK)
	cp $(DEV_LOCK) $(DEV_LOCK).new
	echo pip | $(UV_COMPILE) - pyproject.toml --extra build --extra dev --constraint $(LOCK) -o $(DEV_LOCK).new
	cmp -s $(DEV_LOCK).new $(DEV_LOCK) && rm $(DEV_LOCK).new || mv $(DEV_LOCK).new $(DEV_LOCK)

# Debian packages the tests drive: reference plugins, the libcni sources, etcd, podman.
deps:
	bash .ci/apt-deps

driver: $(VENV)/bin/cnidriver
$(VENV)/bin/cnidriver: tests/e2e/driver/main.go tests/e2e/driver/build.sh | venv
	bash tests/e2e/driver/build.sh $@

# The frozen multicall bundle and the ready CNI_PATH dir dist/cni-bin (bundler/build.py). Refuses a build
# environment that is not exactly bundler/requirements.lock; rebuilds only when its inputs changed
# (dist/cni-bin.inputs; `$(PY) -m bundler.build --force` rebuilds anyway).
bundle: venv
	$(PY) -m bundler.build

# The image, offline with podman: a base of exactly the system libraries the bundle loads, then
# bundler/Dockerfile on it (bundler/image.py). SAVE=dist/pycni.tar also writes a docker-archive.
image: deps bundle
	$(PY) -m bundler.image $(if $(SAVE),--save $(SAVE))

# Two builds from the same lock (the second from a copy of the sources at another path) compared file by
# file (bundler/repro.py; durations: bundler/README.md). `make test` runs the same check
# as tests/unit/test_bundle_repro.py; this target runs it alone and keeps nothing.
check-repro: venv
	$(PY) -m bundler.repro

# ruff, mypy strict, and the layer and dependency-boundary contracts (import-linter: pyproject.toml)
lint: venv
	$(VENV)/bin/ruff check cni ipam bundler tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: venv
	$(VENV)/bin/pytest -q tests/unit

# e2e: our plugins against Debian's through real libcni (root; PYCNI_PLUGIN_DIR=dist/cni-bin for frozen)
e2e: deps venv driver
	$(VENV)/bin/pytest -q tests/e2e

# Three passes: everything from source (with the cluster suite, tests/cluster: a real single-node cluster
# from ../shared, pycni's image installed on it with kubectl apply -k; it runs only here, once), then the
# integration and e2e suites against the frozen entries,
# once in-process (no agent) and once through the frozen node-local agent (PYCNI_TEST_AGENT=1). The frozen
# passes leave to the first what runs no frozen entry or only repeats a scenario at an older cniVersion,
# the agent pass to the frozen one the tests none of whose calls can reach the session's agent
# (tests/conftest.py frozen_selection; they print how many).
# The passes run as nine pytest sessions, PYCNI_TEST_JOBS (default 3) at a time (tests/passes.py).
test: deps venv driver lint bundle
	$(PY) -m tests.passes $(CURDIR)/dist/cni-bin

# The long hardening run: the fuzz suite with the `fuzz` hypothesis profile (EXAMPLES per test and case,
# default 5000; CI runs the bounded `ci` profile as part of `make test`).
fuzz: venv
	PYCNI_FUZZ_PROFILE=fuzz $(if $(EXAMPLES),PYCNI_FUZZ_EXAMPLES=$(EXAMPLES)) $(VENV)/bin/pytest -q tests/hardening/test_fuzz.py

# Only what the demo uses: python3.12, iproute2 and ping (no virtualenv: its path imports only the
# standard library). It runs the frozen bundle when `make bundle` built one (tests/demo.py).
demo:
	@test -n "$(PYTHON)" || { echo "python3.12 not found (install it with pyenv)"; exit 1; }
	bash .ci/apt-deps iproute2 iputils-ping
	$(PYTHON) -m tests.demo

bench: deps venv driver
	$(PY) -m tests.bench.macvlan $(if $(N),-n $(N))

# Bundle size, cold VERSION and ADD+DEL vs Debian's Go plugins, empty-bundle floor (not a timed test).
bench-bundle: deps venv driver bundle
	$(PY) -m bundler.build --empty
	$(PY) -m tests.bench.bundle

# ADD+DEL and a 16-attachment pod: Debian's Go plugins, pycni standalone, pycni through the agent.
# Per store (local, kubernetes via the API emulator, a real etcd): 200 concurrent ADDs (allocations/s,
# p50/p99), one ADD into a pool of 60,000 and into a /64 holding 100,000 (not a timed test).
bench-ipam: deps venv
	$(PY) -m tests.bench.ipam

# Upstream whereabouts vs pycni standalone vs pycni through per-node agents on one real kube-apiserver
# (../shared/upstream): P pods x N networks on K nodes, ADD then DEL (tests/bench/ipam_scale.py; not a
# timed test; ARGS="--scenario 313", "--mode shared|per-network|slices|both|all", "--source", ...; JSON in
# dist/bench/).
bench-ipam-scale: deps venv bundle
	$(PY) -m tests.bench.ipam_scale $(ARGS)

# One shared pool as it fills: one uncontended ADD and DEL at 0 to 8,000 entries, pycni (frozen, no agent)
# against upstream whereabouts v0.9.4 on one real kube-apiserver: wall ms, API-server CPU ms and requests per
# call, the pool's bytes (tests/bench/pool_fill.py; not a timed test; ARGS="--fill 0,2000 --runs 5"; JSON in
# dist/bench/).
bench-pool-fill: deps venv bundle
	$(PY) -m tests.bench.pool_fill $(ARGS)

bench-warm: deps venv driver bundle
	$(PY) -m tests.bench.warm $(if $(N),-n $(N))

# The `rail` option's cost: ADD with and without it, standalone and through the agent, against Debian's
# macvlan and macvlan + tuning + sbr; median of three runs (tests/bench/rail.py; not a timed test).
bench-rail: deps venv driver bundle
	$(PY) -m tests.bench.rail $(if $(N),-n $(N))

# Pod start-up on a real node (../shared/upstream kube-node-up + Multus): N pods x M macvlan+whereabouts
# networks created at once, until all Running and all gone, for pycni with and without its agent, for
# Debian's Go macvlan + upstream whereabouts v0.9.4 and for the node's floor (the same pods, no secondary
# network) (tests/bench/cluster.py; not a timed test; ARGS="-n 8 -m 2", "--only upstream,floor"; JSON in
# dist/bench/).
bench-cluster: deps venv
	$(PY) -m tests.bench.cluster $(ARGS)

# Multus thick (upstream v4.3.0's DaemonSet, 100m CPU / 50Mi) on a real node: N pods at once (default 6
# and 12) with pycni's agent, without it (the plugins in multus-daemon's container) and with Debian's Go
# macvlan + upstream whereabouts: pods Running, multus-daemon restarts and OOM kills, time to all
# Running (tests/bench/thick.py; not a timed test; ARGS="-n 6,12 --rounds 3"; JSON in dist/bench/).
# Beside it, the memory one in-process ADD charges a cgroup: python -m tests.bench.call_memory.
bench-thick: deps venv
	$(PY) -m tests.bench.thick $(ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis
