# Two commands: `make run` (set up, then a local chain with JSON-RPC on 127.0.0.1:8545) and
# `make test` (set up, then the whole test suite and the linter). `make bench` runs the
# benchmarks (about 20 minutes) and writes benchmarks/results/latest.json.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TESTNET_DIR ?= .testnet
VALIDATORS ?= 4

.PHONY: setup run test lint tools unit integration bench profile clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

run: setup
	@test -f $(TESTNET_DIR)/testnet.json || \
		$(VENV)/bin/pbft-node testnet init --validators $(VALIDATORS) --dir $(TESTNET_DIR)
	$(VENV)/bin/pbft-node testnet run --dir $(TESTNET_DIR)

# Phase one: the unit tests run beside the audit ETL's, in two processes (the tests with
# real nodes or a Spark cluster, and the ones on tables); then phase two, the integration
# tests alone: their clusters keep their timers' margins. Phase one is CPU-bound (a third ETL
# process made it slower), phase two is not: the simulator's seeds (pure CPU on simulated
# clocks) run through both at the lowest priority (nice 19), on the CPU time the others
# leave. Every suite runs; the target fails if one failed.
ETL_WITH_NODES := $(addprefix tests/etl/,test_lying_node.py test_testnet_audit.py \
	test_standalone_cluster.py test_state_audit.py test_class_archive.py \
	test_validator_votes.py)
ETL_ON_TABLES := $(filter-out $(ETL_WITH_NODES),$(wildcard tests/etl/test_*.py))
test: setup lint tools
	@nice -n 19 $(PY) -m pytest -q -p no:cacheprovider tests/simulation > .sim-tests.log 2>&1 & \
	sim=$$!; $(PY) -m pytest -q -p no:cacheprovider tests/unit > .unit-tests.log 2>&1 & \
	pure=$$!; $(PY) -m pytest -q -p no:cacheprovider $(ETL_WITH_NODES) > .etl-tests.log 2>&1 & \
	nodes=$$!; $(PY) -m pytest -q $(ETL_ON_TABLES); etl=$$?; \
	wait $$nodes; nodes=$$?; wait $$pure; pure=$$?; \
	cat .etl-tests.log .unit-tests.log; rm -f .etl-tests.log .unit-tests.log; \
	$(PY) -m pytest -q tests/integration; integration=$$?; \
	wait $$sim; sim=$$?; cat .sim-tests.log; rm -f .sim-tests.log; \
	test $$pure -eq 0 -a $$sim -eq 0 -a $$etl -eq 0 -a $$nodes -eq 0 -a $$integration -eq 0

# Debian packages two tests use: headless Chromium renders the audit's HTML report, and
# promtool checks the Prometheus configuration, alert rules and dashboard queries
tools:
	@command -v chromium >/dev/null || (apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)
	@command -v promtool >/dev/null || (apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)

# ruff everywhere; mypy, strict, on the packages pyproject.toml's [tool.mypy] lists
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q tests/unit

integration: setup
	$(PY) -m pytest -q tests/integration

# ethereum-etl, for the read benchmark, in its own environment (it pins an older web3 than ours)
ETL_VENV ?= .venv-ethereum-etl

$(ETL_VENV)/.installed:
	$(PYTHON) -m venv $(ETL_VENV)
	$(ETL_VENV)/bin/pip install --quiet "ethereum-etl==2.4.2"
	# its parsimonious 0.8 imports inspect.getargspec, gone in Python 3.11; 0.10 works
	$(ETL_VENV)/bin/pip install --quiet --no-deps "parsimonious==0.10.0" "regex>=2023"
	touch $@

bench: setup $(ETL_VENV)/.installed
	$(PY) -m benchmarks

profile: setup
	$(PY) -m pip install --quiet py-spy
	$(PY) -m benchmarks.profile --validators 1 --out benchmarks/results/profile-n1
	$(PY) -m benchmarks.profile --validators 4 --out benchmarks/results/profile-n4

clean:
	rm -rf $(VENV) $(ETL_VENV) $(TESTNET_DIR) .pytest_cache .ruff_cache .mypy_cache
