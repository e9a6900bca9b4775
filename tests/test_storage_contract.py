"""No SQL outside memory/ and the delivery stores (issue 16, SEAMS seam 4; issue 28): read from
the source, so a query added to bot/ fails here rather than in review — and a query that only
SQLite accepts never ships in a module the PostgreSQL store suites do not run.

The one exception is declared: the delivery spine's own stores, ``bot/delivery/*_store.py``
(the inbox and the outbox), whose contract tests run on both backends (tests/delivery).

A statement is recognised by its shape in any string literal (f-strings included), and a
database call by its method name; bot/ may still catch sqlite3's exception classes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SQL = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bSELECT\s+(COUNT|MAX|MIN|1)\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|\bPRAGMA\s+\w+|\bCREATE\s+(TABLE|INDEX|TRIGGER|VIEW)\b"
    r"|\bBEGIN(\s+IMMEDIATE)?\s*(;|$)|\b(COMMIT|ROLLBACK)\s*;?\s*$")
DB_CALLS = {"execute", "executemany", "executescript", "execute_fetchall", "fetchone", "fetchall",
            "fetchmany", "transaction", "backup"}
DRIVERS = {"sqlite3.connect", "aiosqlite", "psycopg", "psycopg_pool", "asyncpg"}


def findings(path: Path) -> list[str]:
    out: list[str] = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
            out.append(f"line {node.lineno}: SQL {node.value.strip()[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            owner = ast.unparse(node.func.value)
            if name in DB_CALLS:
                out.append(f"line {node.lineno}: {owner}.{name}(…)")
            elif f"{owner}.{name}" in DRIVERS:
                out.append(f"line {node.lineno}: {owner}.{name}(…)")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad = [m for m in mods if m.split(".")[0] in DRIVERS]
            if bad:
                out.append(f"line {node.lineno}: imports {bad}")
    return out


# The store modules of bot/ (SQL over the Database port, run on both backends by tests/delivery).
STORE_MODULES = ("bot/delivery/*_store.py",)


def store_modules() -> set[Path]:
    return {p for pattern in STORE_MODULES for p in ROOT.glob(pattern)}


def test_no_sql_outside_memory():
    stores = store_modules()
    files = sorted(p for p in (ROOT / "bot").rglob("*.py") if p not in stores)   # every other module
    assert len(files) > 30
    found = {str(p.relative_to(ROOT)): f for p in files if (f := findings(p))}
    assert not found, ("SQL and database calls belong in a memory/ store (over the Database "
                       f"port, written once for both dialects): {found}")


def test_the_detector_sees_what_bot_used_to_hold(tmp_path):
    """The shapes this file looks for are the ones bot/ really held before they moved."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "async def f(db, conn, sid):\n"
        "    await db.fetchone(f'SELECT content FROM messages WHERE session_id = {sid}')\n"
        "    rows = await db.fetchall('x')\n"
        "    conn.execute('PRAGMA integrity_check')\n"
        "    n = 'SELECT COUNT(*) FROM conversations'\n"
        "import aiosqlite\n")
    got = findings(sample)
    assert len(got) == 7, got
    clean = tmp_path / "clean.py"
    clean.write_text("import sqlite3\n"
                     "def g(out, e):\n"
                     "    out.write('Select a user from the list, then update the rules.')\n"
                     "    return isinstance(e, sqlite3.Error)\n")
    assert findings(clean) == []


def test_the_declared_store_modules_are_the_delivery_stores_and_hold_the_sql():
    """The exception is exactly the inbox and outbox stores: a new bot/ module with SQL in it is
    not let through by a wide pattern, and each declared store really is one (SQL found)."""
    names = sorted(str(p.relative_to(ROOT)) for p in store_modules())
    assert names == ["bot/delivery/inbox_store.py", "bot/delivery/outbox_store.py"], names
    for p in store_modules():
        assert findings(p), f"{p.relative_to(ROOT)} is declared a store but holds no SQL"


def test_the_delivery_store_contract_tests_run_on_both_backends():
    """tests/delivery's `backend` is parametrised over both, and its lease tests use `db`."""
    conftest = (ROOT / "tests/delivery/conftest.py").read_text()
    assert "params=BACKENDS" in conftest
    assert "db" in (ROOT / "tests/delivery/test_leases.py").read_text()
