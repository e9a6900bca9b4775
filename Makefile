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

# The whole suite (the store contract suites on SQLite and PostgreSQL), then the apps of
# tests/e2e and tests/bot once more on PostgreSQL. Both start a throwaway cluster of their own.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m "" --backend=postgres tests/e2e tests/bot $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache
