# ratifier — the one entry point for people, hooks and CI.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest
export RATIFIER_BIN := $(CURDIR)/$(BIN)/ratifier
# Every target here runs against the local deployment (demo, dashboard, tests, bench): the
# built-in keys of development mode (docs/operations.md); `make ... RATIFIER_DEVELOPMENT_MODE=false`
# checks a start with real keys instead.
export RATIFIER_DEVELOPMENT_MODE ?= true

.PHONY: help install up down status lint contract format schemas unit client fuzz soak integration browser e2e cluster chaos partitions manifests test dashboard demo bench bench-quick bench-idle bench-approvals bench-operators bench-replies bench-validator bench-authorizer bench-executor clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo "install: creating $(VENV) with $(PYTHON) and installing ratifier[dev]…"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(STAMP) ## create .venv and install the project with dev tools

up: install ## start Kafka, Redis, PostgreSQL on loopback (installs what is missing) and migrate
	deploy/local/up

down: ## stop the demo's processes and what `up` started
	deploy/local/down

status: ## show the local services
	deploy/local/status

lint: install ## ruff (lint + format check), mypy --strict, import-linter layering contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

ASYNCAPI_TOOL := tools/asyncapi
$(ASYNCAPI_TOOL)/node_modules/.package-lock.json: $(ASYNCAPI_TOOL)/package-lock.json
	@command -v npm >/dev/null || { echo "contract: installing nodejs and npm (Debian packages)…"; \
		apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
	cd $(ASYNCAPI_TOOL) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

contract: install $(ASYNCAPI_TOOL)/node_modules/.package-lock.json ## the AsyncAPI and OpenAPI documents are fresh and valid (official parser, openapi-spec-validator)
	$(BIN)/python -m ratifier.contract_export --check
	node $(ASYNCAPI_TOOL)/validate.mjs schemas/json/asyncapi.json
	$(BIN)/openapi-spec-validator --schema 3.1 schemas/json/openapi-approvals.json schemas/json/openapi-dashboard.json

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

schemas: install ## regenerate the JSON Schema files and the AsyncAPI document under schemas/json
	$(BIN)/python -m ratifier.contract_export

unit: install ## pure tests, no I/O (with a short fuzz run of the pure stages)
	$(PYTEST) tests/unit tests/fuzz examples

client: install ## the agent-side distribution (clients/python, ratifier-client): built, installed alone in .venv-client, its tests run there
	$(BIN)/python -m tests.client_venv >/dev/null
	cd clients/python && ../../.venv-client/bin/pytest -q tests

integration: up ## tests against real Kafka, Redis and PostgreSQL
	$(PYTEST) tests/integration -m integration --durations=10

browser: ## install Debian's chromium for the dashboard's browser test, when it is missing
	deploy/local/browser

e2e: up browser ## the whole pipeline through Kafka with real worker processes
	$(PYTEST) tests/e2e -m e2e --durations=15

manifests: install ## validate deploy/k8s, deploy/compose.yaml and the Dockerfile offline (also in `make unit`)
	$(PYTEST) tests/unit/test_deploy_manifests.py -q

cluster: up ## only the tests that start private Kafka instances (3 brokers, SASL_SSL; ~2 min)
	$(PYTEST) tests/integration tests/e2e -m cluster

test: up lint contract unit client integration e2e ## everything CI runs

dashboard: up ## serve the web dashboard on http://127.0.0.1:6070/ (Ctrl-C stops it)
	$(BIN)/ratifier dashboard

demo: up ## run the pipeline on a short scenario, print outcomes, leave it and its dashboard running
	$(BIN)/ratifier demo

fuzz: up ## ≥100k fuzzed inputs through the pure stages, 10k records through the real pipeline
	RATIFIER_FUZZ_EXAMPLES=40000 $(PYTEST) tests/fuzz -q -p no:cacheprovider
	RATIFIER_FUZZ_KAFKA_RECORDS=10000 $(PYTEST) tests/e2e/test_fuzz_through_kafka.py -m e2e -q -s

soak: up ## 10 min at half capacity, duplicates, approvals, invalid calls, restarts → test-artifacts/soak.json
	$(PYTEST) tests/soak -m soak -q -s

chaos: install ## kill -9s, broker/Redis/PostgreSQL outages, provider faults, poison on PRIVATE services (~20 min) → test-artifacts/chaos.json
	flock /tmp/ratifier-e2e.lock $(PYTEST) tests/chaos -m chaos -q -s -p no:cacheprovider

partitions: install ## faults BETWEEN hosts in network namespaces (partitions, slow links, clock skew, rolling restarts; root, ~25 min) → test-artifacts/partitions.json
	deploy/partitions/cluster run

bench: up ## every baseline and ratifier benchmark in one run (< 20 min) → bench/RESULTS.md
	$(BIN)/python -m bench

bench-quick: up ## every bench step with tiny sizes (~5 min; not the verdicts) → test-artifacts/bench-quick/RESULTS.md
	$(BIN)/python -m bench --quick

bench-idle: up ## T5 for real: 30 min idle, then one call → bench/idle-result.json (in RESULTS.md)
	$(BIN)/python -m bench.idle 1800
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

bench-approvals: install ## approval-join state after 10^6 approvals (pure, ~10 min) → bench/approval-state-result.json, RESULTS.md
	$(BIN)/python -m bench.approval_state --approvals 1000000 --rate 200 --write
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

bench-operators: up ## the operator's commands start to exit (--help, freeze, freezes, budgets, limits, ops; ~1 min) → bench/operator-commands-result.json, RESULTS.md
	$(BIN)/python -m bench.operator_commands --runs 10 --write
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

bench-replies: up ## reply routing: 50 client processes x 100 calls in flight, home partitions vs reply topics, twice (~4 min) → bench/replies-result.json, RESULTS.md
	$(BIN)/python -m bench.replies --clients 50 --calls 100 --rounds 2 --write
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

test-admission-flood: up ## issues 27, 45: 20,000 reads of tenant A beside B's steady reads (apart/shared partitions x limit 200/s/none, forged, A alone), strict bounds → test-artifacts/admission-flood.json
	RATIFIER_TEST_FLOOD=20000 RATIFIER_TEST_FLOOD_STRICT=1 $(PYTEST) tests/e2e/test_admission.py -m e2e -q -s -p no:cacheprovider

test-admission-fleet: up ## issue 27: three limiter processes share one 300/s budget for 60 s, one SIGKILLed mid-run (±10 %)
	RATIFIER_TEST_ADMISSION_SECONDS=60 $(PYTEST) tests/integration/test_admission_limiter.py -m integration -q -p no:cacheprovider

bench-contended: up ## issue 46: T2, CPU per read and T4 again with one core kept busy by a CPU hog, vs B2r of the same run (~8 min; after make bench) → bench/contended-result.json, RESULTS.md
	$(BIN)/python -m bench.contended --write
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

bench-admission: up ## admission's CPU per call (admitted, refused) and the last flood's noisy-neighbour figures
	$(BIN)/python -m bench.admission 10000

bench-validator: up ## validator benchmark alone (pure and through Kafka; prints its table)
	$(BIN)/python -m bench.validator 20000

bench-authorizer: up ## authorizer benchmark (single vs batched Cedar, stage through Kafka)
	$(BIN)/python -m bench.authorizer 10000

bench-executor: up ## executor benchmark (with and without the Redis fast path, claim cost)
	$(BIN)/python -m bench.executor 5000

.PHONY: mutants
mutants: up ## each one-line break of tests/mutants/catalogue.toml in a temp clone: its test must fail (~15 min; ONLY=a,b LONG=1 LIST=1) → docs/testing.md, test-artifacts/mutants.json
	$(BIN)/python -m tests.mutants $(if $(LIST),--list) $(if $(ONLY),--only $(ONLY)) $(if $(LONG),--long)

clean: ## remove the virtualenv and caches (not the services' data)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis test-artifacts
