# Two commands for a fresh machine: `make serve` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EXTRAS ?= server,operator,spark,dev

.PHONY: serve test test-fast test-long simulate lint deps system-deps images bench clean

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.server: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[server]'
	touch $@

$(VENV)/.all: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[$(EXTRAS)]'
	touch $@

## Run the server on the embedded default: LMDB + log files in ./data, port 4437.
serve: $(VENV)/.server
	$(VENV)/bin/durable-streams-server serve

# The tests' Python processes keep their bytecode, under build/pycache (not next to the
# sources, which images and packages copy). Where the environment sets
# PYTHONDONTWRITEBYTECODE (these machines do), every server, emulated API server and
# operator a test starts compiled our modules again (0.35 of a server's 1.2 CPU s to
# start), and each pytest worker rewrote every test module's asserts (20 CPU s).
BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache
# `make test` has just installed everything, so a test whose program or package is
# missing fails instead of skipping (testkit/needs.py); -rfEs lists every skip left.
PYTEST := $(BYTECODE) TEST_REQUIRE_ALL=1 $(PY) -m pytest -rfEs

## Install everything the tests need, then run the whole suite: nothing skipped for want of a package.
## Three workers, each taking whole files (module fixtures and a file's shared paths stay
## together). The suite is bound by the CPU of two cores, yet with two workers the machine
## was idle a quarter of the time, both waiting (leases, servers starting, the image
## build's downloads); a third fills it: 22:32 against 27:41 (docs/performance.md).
## The 25 slowest tests are listed at the end: the suite must stay under 25 minutes in CI.
## It is bound by the two cores' CPU: `-p testkit.cpu_timeline` records each test's CPU,
## `python e2e/cpu_by_process.py -- CMD` a command's by kind of process.
## The process tests of a replica set that the simulation covers (`simulated`: each names
## the faults and mutants that cover it, testkit/simulated_tier.py) run in test-long.
TEST_WORKERS ?= 3
test: deps
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --durations=25 -m "not simulated"

## The fast tier (about two minutes on two cores, 1,330 tests): the protocol, streams, subscriptions and retention
## in-process (testkit/asgi.py) on the real engine, and every other test that starts no
## process (a test that does fails unless marked `processes`: testkit/tiers.py), but
## for the `slow` ones (crash-state explorers, the operator run by kopf). `make test`
## runs them all.
test-fast: $(VENV)/.all
	$(BYTECODE) $(PY) -m pytest -m "not processes and not slow" -n $(TEST_WORKERS) --dist loadfile -q

## The replica set simulated on virtual time (testkit/simulate): SEEDS healthy seeds, then
## each mutant (a rule broken on purpose) must be caught. `make test` runs a few of each
## through tests/simulation; `make test-long` runs 5000 seeds.
SEEDS ?= 200
simulate: $(VENV)/.all
	$(PY) -m testkit.simulate --seeds $(SEEDS)
	for m in $$($(PY) -m testkit.simulate --list-mutants | cut -d: -f1); do \
		$(PY) -m testkit.simulate --seeds 200 --mutant $$m --first || exit 1; done

## The long fault and fuzz profile: 50 kill -9 rounds per crash test, 5000 fuzz requests,
## every crash state of the explorer's workloads with 12 random mixes per crash point,
## 10 primaries of a replica set killed one after the other under load, and each replica-set
## fault of tests/replication/test_faults_*.py (partitions, pauses, lost Lease answers, a slow
## clock, a full disk, kill -9 of two) repeated 5 times under load, and the other tests marked
## `simulated` (test_failover.py ran whole just before); then the archive tests
## against Ceph's RADOS Gateway (ARCHIVE_STORE=ceph; its packages are installed for this only).
test-long: deps
	CRASH_ROUNDS=50 FUZZ_EXAMPLES=5000 CRASH_STATES=1000000 CRASH_MIXED=12 FAILOVER_ROUNDS=10 \
		FAULT_ROUNDS=5 \
		$(PYTEST) e2e/test_crash.py e2e/test_faults.py e2e/test_http_fuzz.py \
		tests/engine/test_crash_states.py tests/replication/test_failover.py \
		tests/replication/test_faults_*.py
	$(PYTEST) -m simulated --ignore=tests/replication/test_failover.py
	ARCHIVE_STORE=ceph $(PYTEST) tests/archive
	$(PY) -m testkit.simulate --seeds 5000 --seed 1000
test-long: LONG_DEPS := 1

## Everything the tests and the benchmark need; the only place anything is installed.
deps: $(VENV)/.all system-deps
	cd e2e/conformance && npm install --no-audit --no-fund --loglevel=error
	cd e2e/bench && npm install --no-audit --no-fund --loglevel=error

## The side-by-side benchmark against the Node reference server (a few minutes).
bench: deps
	$(PY) e2e/bench/run.py

## The container images durable-streams-server, -operator and -spark, tagged with the project's
## version, built with podman (runc): wheels built on the host, the public python base, or a
## Debian base made by mmdebstrap where no registry answers; unchanged images are reused.
## BUILD_IMAGES_FLAGS passes options on (--force, --base public|debian|IMAGE, --engine docker).
images: $(VENV)/bin/python system-deps
	$(PY) scripts/build_images.py $(BUILD_IMAGES_FLAGS)

## Debian packages the tests and the benchmark use (installed only when missing; needs root
## or password-less sudo, and fails, naming them, when they cannot be installed).
system-deps:
	@LONG=$(LONG_DEPS) bash scripts/system-deps.sh

## Style, formatting and the import contracts (pyproject.toml [tool.importlinter]).
lint: $(VENV)/.all
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) e2e/conformance/node_modules e2e/bench/node_modules
