# lakesink -- every target installs what it needs into .venv first (from setup.cfg, pinned by
# constraints.txt), so each works on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1
export PYTHONUNBUFFERED := 1
MODE ?= foreach
PYTEST_ARGS ?=
BENCH_ARGS ?=
SOURCES := lakesink lakesink_reader reader pyspark_lakesink.py devtools jobs tests scripts bench

.PHONY: help java install run run-s3 run-cluster test chaos cluster bench lint typecheck clean

help: ## list the targets and the variables they take
	@echo "targets:"
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'
	@echo "variables:"
	@echo "  MODE=foreach|epoch     writer mode of the run* demos (default: foreach)"
	@echo "  PYTEST_ARGS='...'      extra pytest arguments for test, chaos, cluster (e.g. -k reader -x)"
	@echo "  BENCH_ARGS='...'       extra arguments of bench/run.py (e.g. --rows 2000000 --repeats 1)"
	@echo "  BENCH_SMOKE=no         make bench without running the bench's smoke tests first"

# The Makefile is a prerequisite too: a change of how lakesink is installed reinstalls it.
$(STAMP): setup.cfg pyproject.toml constraints.txt Makefile
	@bash scripts/check-java.sh
	@# A .venv made with another Python (an older one, say) is made again, not reused.
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || rm -rf $(VENV)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing lakesink and its pinned dependencies into $(VENV) (about a minute on a fresh machine)"
	@# editable_mode=compat puts the checkout on sys.path (a .pth entry): pyspark finds
	@# format("lakesink") by listing modules with pkgutil, which does not see the import hook a
	@# default (PEP 660) editable install uses, so without it discovery works only from here.
	$(PY) -m pip install -q -c constraints.txt -e '.[spark,s3,pandas,connect,test,dev,bench]' \
		--config-settings editable_mode=compat
	touch $(STAMP)

# Spark 4 runs on Java 17 or 21 only: every target that starts Spark checks first, and so
# does a fresh install (the stamp's recipe), whatever target asked for it.
java:
	@bash scripts/check-java.sh

install: $(STAMP) ## create .venv and install lakesink with every extra (pinned)

run: java $(STAMP) ## demo: stream into a local lake with one injected task failure, then read it back
	$(PY) scripts/demo.py --target local --mode $(MODE)

run-s3: java $(STAMP) ## demo against a moto S3 server on 127.0.0.1 that it starts and stops
	$(PY) scripts/demo.py --target s3 --mode $(MODE)

run-cluster: java $(STAMP) ## standalone master + 2 workers on 127.0.0.1: local and moto S3 lakes, read back
	$(PY) scripts/cluster.py demo

test: java $(STAMP) ## the suite, with bounded chaos and cluster runs (not the long ones), under 20 minutes
	$(PY) -m pytest -m "not bench and not long" --durations=12 $(PYTEST_ARGS)

chaos: java $(STAMP) ## the long kill -9 / lost-answer runs: 20 kills per writer mode and backend
	LAKESINK_CHAOS_KILLS=20 $(PY) -m pytest -m chaos --durations=12 $(PYTEST_ARGS)

cluster: java $(STAMP) ## every standalone-cluster case: 2 modes x local/S3 x executor/worker kill (~8 min)
	$(PY) -m pytest -m cluster --durations=12 $(PYTEST_ARGS)

bench: java $(STAMP) ## the bench's smoke tests, then benchmarks against Spark's parquet sink; writes bench-results.json/.png
	@# The editable install has no bytecode for lakesink, and with PYTHONDONTWRITEBYTECODE set
	@# every Spark worker process would compile it from source: a regular install never does.
	$(PY) -m compileall -q lakesink lakesink_reader reader devtools bench
	@# The full harness on tiny streams first (a few minutes): a broken run fails here, not after
	@# twenty minutes of measuring. BENCH_SMOKE=no skips it.
	@if [ "$(BENCH_SMOKE)" != no ]; then $(PY) -m pytest -m bench -p no:cacheprovider tests/test_bench_smoke.py; fi
	$(PY) bench/run.py $(BENCH_ARGS)

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)

typecheck: $(STAMP) ## mypy (strict) on the libraries and the dev tooling
	$(VENV)/bin/mypy lakesink lakesink_reader reader pyspark_lakesink.py devtools

clean: ## remove the venv and demo output
	rm -rf $(VENV) demo build *.egg-info
