# The two commands of the README: `make run` and `make test`. `make help` lists the rest.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed

.PHONY: help run test test-quick bench bench-quick clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 20

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# What running needs only (no test tools: `make run` on a server stays small).
$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $(RUNTIME)

# The runtime plus the test extras (pytest, Playwright, psycopg, …).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP) $(RUNTIME)

run: $(RUNTIME)  ## install what running needs and start the bot (.venv/bin/ethan serve)
	$(BIN)/ethan serve

# The whole suite: the store contract suites run on SQLite and on PostgreSQL (a throwaway
# cluster the suite starts itself), and so do the app-level tests marked `app_backends`
# (agent, memory layers, context window, Lark rich events, chat rules, providers, commands,
# console and chat API: every store path through the app). `pytest --backend=postgres tests/e2e
# tests/bot` runs every app on PostgreSQL only. Needs PostgreSQL's server binaries and
# Chromium: tests/preflight.py names what is missing in one line (libfaketime is optional: two
# replica tests are skipped without it). `test-quick` needs only Python and make
# (tests/test_docs.py runs its command with the three hidden).
test: $(STAMP)  ## the whole suite (~32 min on 2 cores; needs PostgreSQL server binaries and Chromium)
	$(BIN)/python -m tests.preflight
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

test-quick: $(STAMP)  ## a quick subset (~1 min): settings, CLI, docs, on SQLite; needs only Python and make
	$(BIN)/python -m pytest -q -m "not slow and not browser" tests/bot tests/test_cli.py tests/test_docs.py tests/test_deploy.py tests/test_tree_hygiene.py $(PYTEST_ARGS)

bench: $(STAMP)  ## the benchmarks (bench/README.md)
	$(BIN)/python -m bench

bench-quick: $(STAMP)  ## a short run of the benchmarks
	$(BIN)/python -m bench --quick

clean:  ## remove the virtualenv
	rm -rf $(VENV) .pytest_cache
