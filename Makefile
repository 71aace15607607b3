# make demo: replay the bundled recordings with the embedded defaults (SQLite, dry-run, console).
# make live-demo: the bundled cascade live through a local Kafka-protocol broker (SPEED=1: as
# recorded, 9 minutes; default 10x, about a minute), compared with its replay.
# make test: lint, type-check, check the import contracts and run the whole test suite against
# the real services.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTHON ?= python3

.PHONY: demo live-demo test lint services bench bench-kafka bench-storm bench-all bench-outcome fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/detector replay examples/

SPEED ?= 10
live-demo: $(STAMP)
	$(BIN)/python -m detector.lab.live_demo --speed $(SPEED)

services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && exit 0; sleep 1; done; \
	  echo "PostgreSQL did not start on 127.0.0.1:5432" >&2; exit 1
	@# nginx for tests/integration/test_nginx_actuator.py: installed, never started here (the
	@# tests start their own); policy-rc.d exit 101 keeps the package from starting a system one.
	@if ! command -v nginx >/dev/null && ! test -x /usr/sbin/nginx; then \
	  [ "$$(id -u)" = 0 ] || { echo "nginx missing: run make services as root" >&2; exit 1; }; \
	  echo "installing the Debian package nginx"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    trap 'rm -f /usr/sbin/policy-rc.d' EXIT; \
	    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; \
	  fi; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends nginx; \
	fi
	@# chromium for tests/e2e/test_web_browser.py, driven by PyPI playwright (the dev extra)
	@# with executable_path=/usr/bin/chromium: `playwright install` downloads nothing here.
	@if ! test -x /usr/bin/chromium; then \
	  [ "$$(id -u)" = 0 ] || { echo "chromium missing: run make services as root" >&2; exit 1; }; \
	  echo "installing the Debian package chromium"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends chromium; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check detector tests bench migrations
	$(BIN)/ruff format --check detector tests bench migrations
	$(BIN)/mypy detector
	$(BIN)/lint-imports

test: lint services
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/bench_replay.py

bench-kafka: $(STAMP)
	$(BIN)/python bench/bench_kafka.py

bench-storm: $(STAMP)
	$(BIN)/python bench/bench_storm.py

# make bench-all: every benchmark but bench-outcome; writes bench/RESULTS.md and README's table.
bench-all: $(STAMP)
	$(BIN)/python bench/bench_all.py

bench-outcome: $(STAMP)
	$(BIN)/python bench/bench_outcome.py

fuzz: $(STAMP)
	$(BIN)/python -m detector.lab.fuzz --records 100000

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache detector.db
