"""The private aiosqlite API storage/_aiosqlite_compat.py wraps still has the shape and the
behaviour the SQLite backend relies on (issue 16: "a test that fails on an incompatible
upgrade"), on the aiosqlite installed — and that version is inside the range this was tested on,
which is pyproject.toml's pin.

If this fails after an upgrade: read aiosqlite's changelog and core.py for ``_execute`` and
``_conn``, adapt storage/_aiosqlite_compat.py (the only module that touches them), then widen
``TESTED`` and the pin in pyproject.toml together.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import sqlite3
import threading
from importlib.metadata import version
from pathlib import Path

import aiosqlite
import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from storage import _aiosqlite_compat as compat
from storage.sqlite import SqliteDatabase

ROOT = Path(__file__).resolve().parents[1]


def pinned() -> SpecifierSet:
    text = (ROOT / "pyproject.toml").read_text()
    [line] = [m for m in re.findall(r'^\s*"(aiosqlite[^"]*)"', text, re.M)]
    return Requirement(line).specifier


def test_the_pin_is_the_tested_range_and_the_installed_version_is_in_it():
    spec = pinned()
    assert spec == SpecifierSet(compat.TESTED), (
        f"pyproject.toml pins aiosqlite {spec}, but storage/_aiosqlite_compat.py was tested on "
        f"{compat.TESTED}: run this file on the new range, then change both together")
    assert any(s.operator in ("<", "<=", "==", "~=") for s in spec), \
        "the pin needs an upper bound: a new aiosqlite must be tested here before it is used"
    assert version("aiosqlite") in spec, f"aiosqlite {version('aiosqlite')} is installed, outside {spec}"


def test_private_members_have_the_expected_shape():
    execute = getattr(aiosqlite.Connection, "_execute", None)
    assert execute is not None, "aiosqlite.Connection._execute is gone"
    assert inspect.iscoroutinefunction(execute), "Connection._execute is no longer a coroutine function"
    params = list(inspect.signature(execute).parameters.values())
    assert [p.name for p in params[:2]] == ["self", "fn"], params
    assert any(p.kind is p.VAR_POSITIONAL for p in params), "Connection._execute(fn, *args) takes no *args"
    conn_attr = inspect.getattr_static(aiosqlite.Connection, "_conn", None)
    assert isinstance(conn_attr, property), f"Connection._conn is no longer a property: {conn_attr!r}"


async def test_a_unit_of_work_runs_on_the_sqlite_connection_in_aiosqlites_own_thread(tmp_path):
    aconn = await aiosqlite.connect(tmp_path / "compat.db", isolation_level=None)
    try:
        loop_thread = threading.get_ident()
        # the thread aiosqlite's public API runs statements in, seen from inside SQLite
        await aconn.create_function("tid", 0, threading.get_ident)
        [(public_thread,)] = await aconn.execute_fetchall("SELECT tid()")

        def unit(conn, a, b):
            assert isinstance(conn, sqlite3.Connection), type(conn)
            conn.execute("CREATE TABLE t (x)")
            conn.execute("INSERT INTO t VALUES (?), (?)", (a, b))
            return threading.get_ident(), conn.execute("SELECT tid()").fetchone()[0], conn

        unit_thread, sql_thread, raw = await compat.run_in_thread(aconn, unit, 1, 2)
        assert unit_thread == sql_thread == public_thread != loop_thread
        # the same connection the public API uses: its rows are visible there
        assert [r[0] for r in await aconn.execute_fetchall("SELECT x FROM t ORDER BY x")] == [1, 2]
        assert raw is compat.raw_connection(aconn)

        # an exception comes back as itself (stores catch sqlite3.IntegrityError)
        def violate(conn):
            conn.execute("CREATE UNIQUE INDEX t_x ON t(x)")
            conn.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(sqlite3.IntegrityError):
            await compat.run_in_thread(aconn, violate)

        # calls run in the order they were made, one at a time
        order: list[int] = []
        await asyncio.gather(*(compat.run_in_thread(aconn, lambda c, i=i: order.append(i)) for i in range(50)))
        assert order == list(range(50))
    finally:
        await aconn.close()


async def test_database_read_and_write_go_through_the_wrapper(tmp_path, monkeypatch):
    """storage/sqlite.py uses no other door into aiosqlite's thread: with the wrapper counting, each
    unit of work is exactly one hop."""
    calls: list[str] = []
    real = compat.run_in_thread

    async def counting(aconn, fn, *args):
        calls.append(getattr(fn, "__name__", "?"))
        return await real(aconn, fn, *args)

    monkeypatch.setattr("storage.sqlite.run_in_thread", counting)
    db = await SqliteDatabase(tmp_path / "ethan.db").open()
    try:
        await db.write(lambda c: c.execute("INSERT INTO audit(at, actor, action, target, chat_id, detail, allowed)"
                                           " VALUES (1, 'a', 'x', '', '', '', 1)"))
        n = await db.read(lambda c: c.execute("SELECT COUNT(*) FROM audit").fetchone()[0])
    finally:
        await db.close()
    assert n == 1
    assert calls == ["_in_transaction", "<lambda>"]
