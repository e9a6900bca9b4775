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
# cluster the suite starts itself). `pytest --backend=postgres tests/e2e tests/bot` runs the apps
# on PostgreSQL too; not in `make test` until episode search is ported (docs/operations.md).
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

bench-quick: $(STAMP)
	$(BIN)/python -m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache
