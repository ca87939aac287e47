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

.PHONY: help install run run-s3 run-cluster test chaos bench lint typecheck clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): setup.cfg pyproject.toml constraints.txt
	@bash scripts/check-java.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[spark,s3,test,dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install lakesink with every extra (pinned)

run: $(STAMP) ## demo: stream into a local lake with one injected task failure, then read it back
	$(PY) scripts/demo.py --target local --mode $(MODE)

run-s3: $(STAMP) ## demo against a moto S3 server on 127.0.0.1 that it starts and stops
	$(PY) scripts/demo.py --target s3 --mode $(MODE)

run-cluster: $(STAMP) ## standalone master + 2 workers on 127.0.0.1: local and moto S3 lakes, read back
	$(PY) scripts/cluster.py demo

test: $(STAMP) ## the full suite (bounded chaos runs included), under 20 minutes
	$(PY) -m pytest -m "not bench" --durations=12 $(PYTEST_ARGS)

chaos: $(STAMP) ## the long kill -9 / restart runs
	LAKESINK_CHAOS_KILLS=20 $(PY) -m pytest -m chaos $(PYTEST_ARGS)

bench: $(STAMP) ## benchmarks against Spark's own parquet sink; writes bench-results.json
	@# The editable install has no bytecode for lakesink, and with PYTHONDONTWRITEBYTECODE set
	@# every Spark worker process would compile it from source: a regular install never does.
	$(PY) -m compileall -q lakesink reader
	$(PY) bench/run.py $(BENCH_ARGS)

lint: $(STAMP) ## ruff check + format check
	$(VENV)/bin/ruff check lakesink reader jobs tests scripts bench
	$(VENV)/bin/ruff format --check lakesink reader jobs tests scripts bench

typecheck: $(STAMP) ## mypy on the libraries
	$(VENV)/bin/mypy lakesink reader

clean: ## remove the venv and demo output
	rm -rf $(VENV) demo build *.egg-info
