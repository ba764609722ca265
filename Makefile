# The two commands: `make dev` and `make test`. Both create .venv and install
# the project into it on a fresh machine; nothing else is needed by hand.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: dev test lint proto proto-check unit bench bench-full bench-ab chaos soak clean promtool rules-check chromium fuzz

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

dev: $(STAMP)
	$(VENV)/bin/corral dev $(DEV_ARGS)

# Test modules run in TEST_WORKERS processes (pytest-xdist), each module
# whole in one of them (its module-scoped cluster is started once); the
# slowest tests are printed at the end. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2

test: $(STAMP) proto-check lint rules-check chromium
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy corral services cli tests bench scripts

proto: $(STAMP)
	$(PY) scripts/gen_proto.py
	$(PY) scripts/gen_api_docs.py
	$(PY) scripts/gen_config_docs.py
	$(PY) scripts/gen_http_authz_docs.py

proto-check: $(STAMP)
	$(PY) scripts/gen_proto.py --check
	$(PY) scripts/gen_api_docs.py --check
	$(PY) scripts/gen_config_docs.py --check
	$(PY) scripts/gen_http_authz_docs.py --check

# Prometheus rules (deploy/observability/): promtool comes from Debian's
# `prometheus` package, installed here when it is missing and apt-get can.
PROMTOOL ?= promtool
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

promtool:
	@command -v $(PROMTOOL) >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "promtool is missing: installing Debian's prometheus package"; \
	    $(SUDO) apt-get install -y prometheus >/dev/null 2>&1 \
	      || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y prometheus; }; \
	  else \
	    echo "promtool is missing and apt-get is not available: install Prometheus's" \
	      "promtool (e.g. the prometheus package) or set PROMTOOL=/path/to/promtool" >&2; \
	    exit 1; \
	  fi; }

rules-check: promtool
	$(PROMTOOL) check rules deploy/observability/rules/*.yml
	$(PROMTOOL) test rules deploy/observability/tests/*.yml

# The web UI tests (tests/ui/) drive Debian's chromium through its
# chromedriver; both are installed here when missing and apt-get can.
CHROMIUM ?= chromium
CHROMEDRIVER ?= /usr/bin/chromedriver

chromium:
	@{ command -v $(CHROMIUM) >/dev/null 2>&1 && test -x $(CHROMEDRIVER); } || { \
	  if command -v apt-get >/dev/null 2>&1; then \
	    echo "chromium or chromedriver is missing: installing Debian's chromium and chromium-driver"; \
	    $(SUDO) apt-get install -y chromium chromium-driver >/dev/null 2>&1 \
	      || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y chromium chromium-driver; }; \
	  else \
	    echo "chromium is missing and apt-get is not available: install Chromium and its" \
	      "chromedriver (Debian: chromium chromium-driver) or set CORRAL_CHROMIUM and" \
	      "CORRAL_CHROMEDRIVER; the web UI tests skip until then" >&2; \
	  fi; }

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

# The HTTP gateway's fuzz test with its long profile: a few hundred requests
# per route and method, fresh randomness each run (`make test` runs the
# bounded, derandomized one). docs/contributing.md has the gRPC fuzz's too.
fuzz: $(STAMP)
	CORRAL_FUZZ_PROFILE=long $(PY) -m pytest -q tests/e2e/gateway_security/test_fuzz_http.py $(PYTEST_ARGS)

# BENCH_ARGS, e.g. --compare bench/reference/full-20261123-f79e3b9.json
bench: $(STAMP)
	$(PY) -m bench --quick $(BENCH_ARGS)

bench-full: $(STAMP)
	$(PY) -m bench $(BENCH_ARGS)

# the old revision and this tree interleaved on the same machine, W1 and W2,
# 3 rounds each (bench/ab.py), e.g. make bench-ab OLD=main AB_ARGS="--rounds 5"
bench-ab: $(STAMP)
	@test -n "$(OLD)" || { echo "usage: make bench-ab OLD=<rev> [AB_ARGS=...]"; exit 2; }
	$(PY) -m bench.ab --old $(OLD) $(AB_ARGS)

# kill -9 of every role, leader kills with standbys, PostgreSQL stopped and
# killed, under load; prints the table and fails on any loss (bench/chaos.py).
# `make test` runs the short profile (tests/e2e/test_chaos.py).
chaos: $(STAMP)
	$(PY) -m bench.chaos $(CHAOS_ARGS)

# An hour of job churn on `corral dev` with Nomad's default GC settings, RSS
# per role sampled each minute and plotted (bench/soak.py); not in `make test`.
# SOAK_ARGS, e.g. --minutes 10 for a short run.
soak: $(STAMP)
	$(PY) -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
