"""The storage engine's seams (issue 28), read from the source:

- the drivers (aiosqlite, psycopg, psycopg_pool) are imported only in ``storage/``;
- ``storage/`` imports nothing of ``memory/`` or ``bot/`` (the layers use the engine, never the
  other way round: no import cycle between them);
- importing ``storage`` (the port) loads no driver, so catching its errors costs none.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_storage_contract import ROOT
from tests.test_layers import imports

DRIVERS = ("aiosqlite", "psycopg", "psycopg_pool", "asyncpg")


def _product_files(*dirs: str):
    for d in dirs:
        yield from sorted((ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("layer", ["bot", "memory"])
def test_drivers_are_imported_only_in_the_engine(layer):
    found = {}
    for path in _product_files(layer):
        bad = sorted(m for m in imports(path) if m.split(".")[0] in DRIVERS)
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert not found, f"a database driver outside storage/: {found}"


def test_the_engine_imports_no_layer_above_it():
    found = {}
    for path in _product_files("storage"):
        bad = sorted(m for m in imports(path) if m.split(".")[0] in ("memory", "bot"))
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    assert len(list(_product_files("storage"))) >= 5
    assert not found, f"storage/ must not import the layers that use it: {found}"


def test_importing_the_port_loads_no_driver():
    code = ("import sys, storage, memory.facts.store, memory.sessions.store; "
            f"print([m for m in {DRIVERS!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
