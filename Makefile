# The two commands of the README: `make run` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pgtap plpgsql-check pytest rules manual bench chaos chaos-ha clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

## run: the engine and the operator service on the embedded PostgreSQL (or ORCH8_DATABASE_URL)
run: $(STAMP)
	$(BIN)/orch8 up

## test: lint, types, the pgTAP suite, plpgsql_check, pytest
test: lint typecheck pgtap plpgsql-check pytest

lint: $(STAMP)
	@echo "== sqlfluff"
	$(BIN)/sqlfluff lint --disable-progress-bar --processes 0 sql sql_tests
	@echo "== ruff"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	@echo "== mypy (strict on orch8_py and web)"
	$(BIN)/mypy

pgtap: $(STAMP)
	@echo "== pgTAP (pg_prove)"
	$(BIN)/python -m tests.run_pgtap

plpgsql-check: $(STAMP)
	@echo "== plpgsql_check"
	$(BIN)/python -m tests.run_plpgsql_check

pytest: $(STAMP)
	@echo "== pytest"
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15

## rules: regenerate orch8_py/rules.py from a freshly migrated database (after SQL changes)
rules: $(STAMP)
	$(BIN)/python -m tests.gen_rules

## manual: write what psql prints into the DBA manual's ```text blocks (docs/SQL_API.md,
## docs/CONTINUITY_OPERATIONS.md, the README); read the diff before committing it
manual: $(STAMP)
	$(BIN)/python -m tests.dba_manual --write

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# make bench also installs the [bench] extra (DBOS Transact, the engine it compares with);
# make test does not need it
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $(BENCH_STAMP)

## bench: the benchmark (docs/PERFORMANCE.md), orch8 beside DBOS Transact, against
## ORCH8_DATABASE_URL; results in bench/results/ (BENCH_ARGS, e.g. "--instances 500 --pairs 1")
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run_bench $(BENCH_ARGS)

## chaos: the process-level fault tests at scale, a run with verifiers on that prints how
## many unknown receipts they settled and escalated, a tree of parallel, for_each and
## saga through runners killed again and again, and external worker processes killed at
## random (make test runs the short variants)
chaos: $(STAMP)
	ORCH8_CHAOS_INSTANCES=3000 ORCH8_CHAOS_RESTARTS=5 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_runner_processes.py
	ORCH8_CHAOS_INSTANCES=600 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_verifiers.py -k chaos
	ORCH8_CHAOS_TREE_INSTANCES=400 ORCH8_CHAOS_TREE_KILLS=10 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_workflow_processes.py -k chaos
	ORCH8_CHAOS_WORKER_INSTANCES=1000 ORCH8_CHAOS_WORKER_KILLS=20 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_worker_chaos.py

## chaos-ha: a 3-node Patroni + etcd cluster on loopback (Debian packages patroni and
## etcd-server), three SIGKILLs of the primary over 500 instances, in synchronous and in
## asynchronous mode; prints failover and recovery seconds (make test runs one failover)
chaos-ha: $(STAMP)
	ORCH8_HA_FAILOVERS=3 ORCH8_HA_INSTANCES=500 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/test_chaos_ha.py
