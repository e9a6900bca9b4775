# The two commands of the README: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench bench-quick clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ethan serve

# The whole suite: the store contract suites run on SQLite and on PostgreSQL (a throwaway
# cluster the suite starts itself), and so do the app-level tests marked `app_backends`
# (agent, memory layers, context window, Lark rich events, chat rules, providers, commands,
# console and chat API: every store path through the app). `pytest --backend=postgres tests/e2e
# tests/bot` runs every app on PostgreSQL only.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache
