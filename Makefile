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
MODE ?= epoch
PYTEST_ARGS ?=
BENCH_ARGS ?=
SOURCES := lakesink reader/lakesink_reader pyspark_lakesink.py devtools jobs tests scripts bench

.PHONY: help java hdfs-jars iceberg-jars install run run-s3 run-hdfs run-cluster test chaos long cluster simulate fuzz fuzz-mutants mutants bench lint typecheck docs clean

help: ## list the targets and the variables they take
	@echo "targets:"
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'
	@echo "variables:"
	@echo "  MODE=foreach|epoch     writer mode of the run* demos (default: epoch, the mode to choose)"
	@echo "  PYTEST_ARGS='...'      extra pytest arguments for test, chaos, cluster (e.g. -k reader -x)"
	@echo "  BENCH_ARGS='...'       extra arguments of bench/run.py (e.g. --rows 2000000 --repeats 1)"
	@echo "  BENCH_SMOKE=no         make bench without running the bench's smoke tests first"
	@echo "  SEEDS=N START=S        make simulate: how many seeds, from which (default 1000 from 0)"
	@echo "  SIM_ARGS='...'         extra arguments of python -m tests.sim (e.g. --faults lost,kill --actors writer,vacuum)"
	@echo "  CASES=N FUZZ_SEED=S    make fuzz: how many cases, from which seed (default 1000 from 0)"
	@echo "  FUZZ_ARGS='...'        extra arguments of python -m tests.fuzz (e.g. --mutation link_out --template v3)"
	@echo "  MUTANTS=a,b            make mutants / fuzz-mutants: only these mutants (MUTANT_SEEDS=, MUTANT_CASES=: how far)"

# The Makefile is a prerequisite too: a change of how lakesink is installed reinstalls it.
$(STAMP): setup.cfg pyproject.toml reader/setup.cfg reader/pyproject.toml constraints.txt Makefile
	@bash scripts/check-java.sh
	@# A .venv made with another Python (an older one, say) is made again, not reused.
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || rm -rf $(VENV)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing lakesink and its pinned dependencies into $(VENV): 2-3 minutes on a fresh machine, quietly"
	@echo "(pip -q; .venv ends up ~1.3 GB, ~490 MB of it pyspark); later targets reuse it"
	@# editable_mode=compat puts the checkout on sys.path (a .pth entry): pyspark finds
	@# format("lakesink") by listing modules with pkgutil, which does not see the import hook a
	@# default (PEP 660) editable install uses, so without it discovery works only from here.
	@# (PYTHONWARNINGS: setuptools prints a box saying compat mode is transitional; it is what
	@# discovery needs until lakesink moves to a src/ layout, whose editable install is a plain
	@# path entry in every mode.)
	@# Two distributions: lakesink-reader (reader/: the reader and the lake contract) and lakesink
	@# (the writers), which requires the first; both editable, from this checkout.
	PYTHONWARNINGS=ignore $(PY) -m pip install -q -c constraints.txt -e './reader[s3,hdfs,pandas]' \
		-e '.[spark,s3,hdfs,pandas,connect,iceberg,test,dev,bench,docs]' --config-settings editable_mode=compat
	touch $(STAMP)

# Spark 4 runs on Java 17 or 21 only: every target that starts Spark checks first, and so
# does a fresh install (the stamp's recipe), whatever target asked for it.
java:
	@bash scripts/check-java.sh

# A MiniDFSCluster for the HDFS tests: Maven copies hadoop-minicluster's jars (the Hadoop that
# pyspark bundles) into java/hdfs/jars, javac compiles its launcher (devtools/hdfs.py runs it).
HDFS_JARS := java/hdfs/jars/.filled
HDFS_MAIN := java/hdfs/classes/lakesink/devtools/MiniHdfs.class
$(HDFS_JARS): java/hdfs/pom.xml
	@echo "fetching hadoop-minicluster's jars (~115 MB) into java/hdfs/jars"
	rm -rf java/hdfs/jars && cd java/hdfs && mvn -q -B -Dstyle.color=never dependency:copy-dependencies
	touch $@
$(HDFS_MAIN): $(HDFS_JARS) java/hdfs/src/main/java/lakesink/devtools/MiniHdfs.java
	javac -nowarn -d java/hdfs/classes -cp 'java/hdfs/jars/*' java/hdfs/src/main/java/lakesink/devtools/MiniHdfs.java
hdfs-jars: $(HDFS_MAIN) ## fetch and build the MiniDFSCluster the HDFS tests start (Maven, javac)

# Iceberg's Java library (iceberg-data, iceberg-parquet 1.12) and a small reader of a lake's
# Iceberg view that the tests run (devtools/iceberg_java.py): Maven copies the jars, javac compiles.
ICEBERG_JARS := java/iceberg/jars/.filled
ICEBERG_MAIN := java/iceberg/classes/lakesink/devtools/IcebergRead.class
$(ICEBERG_JARS): java/iceberg/pom.xml
	@echo "fetching Iceberg's Java jars (~105 MB, S3FileIO's AWS SDK among them) into java/iceberg/jars"
	rm -rf java/iceberg/jars && cd java/iceberg && mvn -q -B -Dstyle.color=never dependency:copy-dependencies
	touch $@
$(ICEBERG_MAIN): $(ICEBERG_JARS) java/iceberg/src/main/java/lakesink/devtools/IcebergRead.java
	javac -nowarn -d java/iceberg/classes -cp 'java/iceberg/jars/*' java/iceberg/src/main/java/lakesink/devtools/IcebergRead.java
iceberg-jars: $(ICEBERG_MAIN) ## fetch Iceberg's Java library and build the reader the Iceberg view's tests run (Maven, javac)

# A Kafka broker (kafka_2.13) for the Kafka tests and run-kafka, and Spark's Kafka connector
# (4.2.0, the newest served; it runs on pyspark 4.3.0) that jobs put on spark.jars: Maven
# copies each into its git-ignored folder (java/kafka/pom.xml, profiles broker and connector).
KAFKA_JARS := java/kafka/broker-jars/.filled java/kafka/connector-jars/.filled
java/kafka/%-jars/.filled: java/kafka/pom.xml
	rm -rf java/kafka/$*-jars
	mvn -q -B -Dstyle.color=never -f java/kafka/pom.xml -P $* dependency:copy-dependencies
	touch $@
.PHONY: kafka-jars run-kafka
kafka-jars: $(KAFKA_JARS) ## fetch the Kafka broker's and Spark's Kafka connector's jars (Maven)

install: $(STAMP) ## create .venv and install lakesink with every extra (pinned)

run: java $(STAMP) ## demo: stream into a local lake with one injected task failure, then read it back
	$(PY) scripts/demo.py --target local --mode $(MODE)

run-s3: java $(STAMP) ## demo against a moto S3 server on 127.0.0.1 that it starts and stops
	$(PY) scripts/demo.py --target s3 --mode $(MODE)

run-hdfs: java $(STAMP) hdfs-jars ## demo against a MiniDFSCluster on 127.0.0.1 that it starts and stops (checkpoint there too)
	$(PY) scripts/demo.py --target hdfs --mode $(MODE)

run-cluster: java $(STAMP) hdfs-jars ## standalone master + 2 workers on 127.0.0.1: local and moto S3 lakes, read back
	$(PY) scripts/cluster.py demo

run-kafka: java $(STAMP) kafka-jars ## demo: a Kafka broker it starts and stops, a producer, the job killed and restarted
	$(PY) scripts/kafka_demo.py --mode $(MODE)

test: java $(STAMP) hdfs-jars kafka-jars iceberg-jars ## the suite, with bounded chaos and cluster runs (not the long ones), under 20 minutes
	$(PY) -m pytest -m "not bench and not long" --durations=12 $(PYTEST_ARGS)

chaos: java $(STAMP) hdfs-jars kafka-jars ## the long kill -9 / lost-answer runs: 20 kills per writer mode and backend
	LAKESINK_CHAOS_KILLS=20 $(PY) -m pytest -m chaos --durations=12 $(PYTEST_ARGS)
	@# The epoch writer's cursor only saves time: its suite passes unchanged without it.
	LAKESINK_NO_CURSOR=1 $(PY) -m pytest -m "not long" tests/test_epoch_v3.py $(PYTEST_ARGS)

long: java $(STAMP) hdfs-jars kafka-jars iceberg-jars ## the long cases neither make test nor chaos/cluster run (the Iceberg view on HDFS read by Java, a 10M-row backfill, ...)
	$(PY) -m pytest -m "long and not chaos and not cluster" --durations=12 $(PYTEST_ARGS)

cluster: java $(STAMP) hdfs-jars ## every standalone-cluster case: 2 modes x local/S3/HDFS x executor/worker kill (~12 min)
	$(PY) -m pytest -m cluster --durations=12 $(PYTEST_ARGS)

# The deterministic simulation of format 3 (docs/design/simulation.md): Spark-free, its own
# processes (it patches their clocks); a failing seed prints the command that replays it.
SEEDS ?= 1000
START ?= 0
SIM_ARGS ?=
SIM_LEDGER ?= bench/results/simulation-ledger.jsonl
simulate: $(STAMP) ## run SEEDS seeds of the format-3 simulation over 2 processes, a ledger line per 1000; prints seeds/s and failing seeds
	$(PY) -m tests.sim --seeds $(SEEDS) --start $(START) --jobs 2 --keep-going --ledger $(SIM_LEDGER) $(SIM_ARGS)
	$(PY) -m tests.sim --summary $(SIM_LEDGER)

# The fuzzer of the trust boundary (issue 51; docs/design/trust.md): crafted lakes opened by the
# reader and the read-only commands in capped children; a failing case prints its replay.
CASES ?= 1000
FUZZ_SEED ?= 0
FUZZ_ARGS ?=
FUZZ_LEDGER ?= bench/results/fuzz-ledger.jsonl
fuzz: $(STAMP) ## run CASES cases of the trust-boundary fuzzer (crafted lakes, capped children); a ledger line per run
	$(PY) -m tests.fuzz --cases $(CASES) --seed $(FUZZ_SEED) --ledger $(FUZZ_LEDGER) $(FUZZ_ARGS)

# Bugs planted in the product, one at a time, that the simulation must catch (issue 50, item 5):
# each in a scratch copy of the checkout, up to MUTANT_SEEDS seeds of --actors all.
MUTANT_SEEDS ?= 300
MUTANTS ?=
mutants: $(STAMP) ## plant each mutant of tests/sim/mutants.py in a copy and run the simulation on it; exit 1 if one survives
	$(PY) -m tests.sim.mutants --seeds $(MUTANT_SEEDS) --jobs 2 $(if $(MUTANTS),--only $(MUTANTS),)

# Checks of the trust boundary removed from the product, one at a time, that the fuzzer must
# catch (issue 51): each in a scratch copy of the checkout, with the fuzzer options that reach
# it, up to its number of cases (150, some 400) or MUTANT_CASES (tests/fuzz/mutants.py).
MUTANT_CASES ?=
fuzz-mutants: $(STAMP) ## plant each mutant of tests/fuzz/mutants.py in a copy and fuzz it until a case fails; exit 1 if one survives
	$(PY) -m tests.fuzz.mutants $(if $(MUTANT_CASES),--cases $(MUTANT_CASES),) $(if $(MUTANTS),--only $(MUTANTS),)

bench: java $(STAMP) hdfs-jars ## the bench's smoke tests, then benchmarks against Spark's parquet sink; writes bench-results.json/.png
	@# The editable install has no bytecode for lakesink, and with PYTHONDONTWRITEBYTECODE set
	@# every Spark worker process would compile it from source: a regular install never does.
	$(PY) -m compileall -q lakesink reader/lakesink_reader devtools bench
	@# The full harness on tiny streams first (a few minutes): a broken run fails here, not after
	@# twenty minutes of measuring. BENCH_SMOKE=no skips it.
	@if [ "$(BENCH_SMOKE)" != no ]; then $(PY) -m pytest -m bench -p no:cacheprovider tests/test_bench_smoke.py; fi
	$(PY) bench/run.py $(BENCH_ARGS)

lint: $(STAMP) ## ruff check + format check + the import layers (.importlinter)
	$(VENV)/bin/ruff check $(SOURCES)
	$(VENV)/bin/ruff format --check $(SOURCES)
	PYTHONPATH=. $(VENV)/bin/lint-imports

typecheck: $(STAMP) ## mypy (strict) on the libraries and the dev tooling
	$(VENV)/bin/mypy lakesink reader/lakesink_reader pyspark_lakesink.py devtools

# The user guide (mkdocs.yml: docs/, and bench/results/ through docs/bench-results) into the
# git-ignored site/. --strict turns every warning into a failure: a broken link or anchor, a
# page left out of the nav. NO_MKDOCS_2_WARNING: mkdocs-material prints a banner about its
# successor on every build, which is not about this guide. (Not --quiet: it hides the warnings,
# and with them --strict's failure.)
docs: $(STAMP) ## the user guide, built with mkdocs --strict (a broken link fails) into site/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean: ## remove the venv, demo output and the built guide
	rm -rf $(VENV) demo build site *.egg-info
