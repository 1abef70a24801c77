# One task runner for everything: setup, run, lint, test, bench.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup run test test-slow test-unit test-integration test-image test-containers chaos lint format bench clean dev-up dev-down bench-dedup bench-rebalance bench-dlq bench-web bench-failover bench-tenants bench-affinity

$(BIN)/pipeline: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

## setup: create .venv/ with the console scripts and the dev tools installed
setup: $(BIN)/pipeline

## run: local Kafka, topics, example jobs flowing
run: setup
	$(BIN)/python -m examples.run

## test: the default suite (unit + integration against a real local Kafka, with a short scenario
## of each slow kind), in two processes (pytest-xdist; a test file stays on one), each with its
## own Kafka node: 14-18 min on 2 cores; TEST_WORKERS=0 runs it in one (about 24 min), where
## the fault tests meet less load
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -m "not slow and not chaos and not image and not containers" -q --durations=40 \
		-n $(TEST_WORKERS) --dist loadfile

## test-slow: the long scenarios left out of make test: more SIGKILLs, clusters, scale, real cron fires (~19 min)
test-slow: setup
	$(BIN)/pytest -m "slow and not chaos" -q --durations=10

test-unit: setup
	$(BIN)/pytest tests/unit -m "not image and not containers" -q

## test-image: the Dockerfile's build steps in a fresh virtualenv, then every command it runs (~2 min)
test-image: setup
	$(BIN)/pytest -m image -q

## test-containers: the images built (debootstrap, Podman) and docker-compose.yml brought up (~3 min, ~8 the first time)
test-containers: setup
	$(BIN)/pytest -m containers -q -s

test-integration: setup
	$(BIN)/pytest tests/integration -q

## chaos: the long fault-injection suite
chaos: setup
	$(BIN)/pytest -m chaos -q

PY_SOURCES := $(wildcard libs services tests ops examples)

lint: setup
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format $(PY_SOURCES)
	$(BIN)/ruff check --fix $(PY_SOURCES)

## bench: throughput and latency benchmarks; results go to docs/benchmarks.md
## (options in BENCH_ARGS, e.g. BENCH_ARGS="--baseline-ref v0.1.0" or "--no-baseline")
BENCH_ARGS ?=
bench: setup
	$(BIN)/python -m ops.bench $(BENCH_ARGS)

## bench-dedup: idempotency keys: a table of 1,000,000, then a worker with 1,000,000 (~15 min)
bench-dedup: setup
	$(BIN)/python -m ops.bench.dedup_memory
	$(BIN)/python -m ops.bench.dedup_worker

## bench-dlq: the dead-letter index with 100,000 dead letters: refreshes, dashboard queries, memory (~5 min)
bench-dlq: setup
	$(BIN)/python -m ops.bench.dlq_index --letters 100000

## bench-web: the dashboard's pages in Chromium with 100,000 dead letters against none (~5 min)
bench-web: setup
	$(BIN)/python -m ops.bench.web_pages --letters 100000

## bench-rebalance: a worker joins a busy group, per group protocol, on a 3-node local cluster (~10 min)
bench-rebalance: setup
	$(BIN)/python -m ops.bench.rebalance --runs 7 --output docs/benchmarks.md

## bench-tenants: tenant A enqueues 100,000 jobs, then B 1,000: B's waits in read order and with fairness (~3 min)
bench-tenants: setup
	$(BIN)/python -m ops.bench.tenants --output docs/benchmarks.md

## bench-affinity: one worker free on every core against one confined to one core, on one backlog (~2 min)
bench-affinity: setup
	$(BIN)/python -m ops.bench.affinity --jobs 200000 --repeats 7

## bench-failover: a worker, then the scheduler leader, SIGKILLed: how long until their work runs again (~8 min)
bench-failover: setup
	$(BIN)/python -m ops.bench.failover --runs 5 --output docs/benchmarks.md

dev-up: setup
	$(BIN)/pipeline dev up

dev-down: setup
	$(BIN)/pipeline dev down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist

## bench-followups: jobs that each enqueue a job, drained before and after their end waited for Kafka (~3 min)
.PHONY: bench-followups
bench-followups: setup
	$(BIN)/python -m ops.bench.followups --jobs 50000 --repeats 5

## bench-fanout: a running job's enqueue_many of 10,000 jobs, the code before against now (~1 min)
.PHONY: bench-fanout
bench-fanout: setup
	$(BIN)/python -m ops.bench.fanout --jobs 10000 --repeats 5 --rounds 5

## bench-outbox: outbox rows relayed per second from PostgreSQL and SQLite, against enqueue (~3 min)
.PHONY: bench-outbox
bench-outbox: setup
	$(BIN)/python -m ops.bench.outbox --jobs 100000 --output docs/benchmarks.md
