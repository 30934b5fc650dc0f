# ratifier — the one entry point for people, hooks and CI.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST := $(BIN)/pytest
export RATIFIER_BIN := $(CURDIR)/$(BIN)/ratifier

.PHONY: help install up down status lint format schemas unit integration browser e2e test dashboard demo bench bench-idle bench-validator bench-authorizer bench-executor clean

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

lint: install ## ruff (lint + format check), mypy --strict and the import contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

schemas: install ## regenerate the JSON Schema files of the contract under schemas/json
	$(BIN)/python -m schemas.export

unit: install ## pure tests, no I/O
	$(PYTEST) tests/unit

integration: up ## tests against real Kafka, Redis and PostgreSQL
	$(PYTEST) tests/integration -m integration

browser: ## install Debian's chromium for the dashboard's browser test, when it is missing
	deploy/local/browser

e2e: up browser ## the whole pipeline through Kafka with real worker processes
	$(PYTEST) tests/e2e -m e2e

test: up lint unit integration e2e ## everything CI runs

dashboard: up ## serve the web dashboard on http://127.0.0.1:6070/ (Ctrl-C stops it)
	$(BIN)/ratifier dashboard

demo: up ## run the pipeline on a short scenario, print outcomes, leave it and its dashboard running
	$(BIN)/ratifier demo

bench: up ## every baseline and ratifier benchmark in one run (< 20 min) → bench/RESULTS.md
	$(BIN)/python -m bench

bench-idle: up ## T5 for real: 30 min idle, then one call → bench/idle-result.json (in RESULTS.md)
	$(BIN)/python -m bench.idle 1800
	@if [ -f bench/results.json ]; then $(BIN)/python -m bench --render; fi

bench-validator: up ## validator benchmark alone (pure and through Kafka; prints its table)
	$(BIN)/python -m bench.validator 20000

bench-authorizer: up ## authorizer benchmark (single vs batched Cedar, stage through Kafka)
	$(BIN)/python -m bench.authorizer 10000

bench-executor: up ## executor benchmark (with and without the Redis fast path, claim cost)
	$(BIN)/python -m bench.executor 5000

clean: ## remove the virtualenv and caches (not the services' data)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis test-artifacts
