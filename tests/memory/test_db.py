"""storage.sqlite: pragmas, versioned migrations, busy/locked behaviour."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

import storage.sqlite
from storage import DatabaseError, SchemaTooNew
from storage.sqlite import SqliteDatabase
from storage.schema import MIGRATIONS
from memory.scope import Scope
from memory.sessions.store import SessionStore
from tests.round_trips import counting_round_trips


async def test_pragmas(db):
    assert (await db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    assert (await db.fetchone("PRAGMA foreign_keys"))[0] == 1
    assert (await db.fetchone("PRAGMA synchronous"))[0] == 1          # NORMAL
    assert (await db.fetchone("PRAGMA busy_timeout"))[0] == storage.sqlite.BUSY_TIMEOUT_MS


async def test_fresh_database_is_at_the_latest_version(db):
    assert await db.schema_version() == len(MIGRATIONS) >= 2
    rows = await db.fetchall("SELECT version FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, len(MIGRATIONS) + 1))
    assert await db.integrity_check() == "ok"


async def test_reopening_applies_nothing_twice(tmp_path):
    path = tmp_path / "e.db"
    for _ in range(2):
        db = await SqliteDatabase(path).open()
        await db.close()
    db = await SqliteDatabase(path).open()
    try:
        assert (await db.fetchone("SELECT COUNT(*) FROM schema_version"))[0] == len(MIGRATIONS)
    finally:
        await db.close()


async def test_previous_version_database_is_upgraded_with_data_intact(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    # The previous release: only migration 1.
    monkeypatch.setattr(storage.sqlite, "MIGRATIONS", MIGRATIONS[:1])
    old = await SqliteDatabase(path).open()
    assert await old.schema_version() == 1
    store = SessionStore(old)
    res = await store.append_user(Scope("ou_a", "oc_a", "p2p"), "数据库升级之前的消息")
    await store.append_assistant(res.session.id, "reply before the upgrade")
    await old.close()
    monkeypatch.setattr(storage.sqlite, "MIGRATIONS", MIGRATIONS)

    new = await SqliteDatabase(path).open()
    try:
        assert await new.schema_version() == len(MIGRATIONS)
        index = await new.fetchone("SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'sessions_tail'")
        assert index is not None
        store = SessionStore(new)
        assert [m.content for m in await store.messages(res.session.id)] == [
            "数据库升级之前的消息", "reply before the upgrade"]
        assert (await store.resolve(res.session.tail)).id == res.session.id
        assert [h.session.id for h in await store.search("升级之前")] == [res.session.id]
        assert await new.integrity_check() == "ok"
    finally:
        await new.close()


async def test_failed_migration_rolls_back_and_keeps_the_version(tmp_path, monkeypatch):
    path = tmp_path / "e.db"
    db = await SqliteDatabase(path).open()
    await db.close()
    broken = "CREATE TABLE half_done (x INTEGER);\nTHIS IS NOT SQL;"
    monkeypatch.setattr(storage.sqlite, "MIGRATIONS", [*MIGRATIONS, broken])
    with pytest.raises(sqlite3.OperationalError):
        await SqliteDatabase(path).open()
    monkeypatch.setattr(storage.sqlite, "MIGRATIONS", MIGRATIONS)
    db = await SqliteDatabase(path).open()
    try:
        assert await db.schema_version() == len(MIGRATIONS)
        assert await db.fetchone("SELECT 1 FROM sqlite_master WHERE name = 'half_done'") is None
    finally:
        await db.close()


async def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "future.db"
    db = await SqliteDatabase(path).open()
    await db.execute("INSERT INTO schema_version(version, applied_at) VALUES (?, ?)", (len(MIGRATIONS) + 5, time.time()))
    await db.close()
    newer = SqliteDatabase(path)
    with pytest.raises(SchemaTooNew) as e:
        await newer.open()
    message = str(e.value)
    assert f"schema version {len(MIGRATIONS) + 5}" in message and "upgrade Ethan" in message
    assert isinstance(e.value, DatabaseError)
    assert not newer.is_open          # the connection (and its thread) was closed


async def test_two_processes_opening_a_new_database_at_once(tmp_path):
    path = tmp_path / "race.db"
    dbs = await asyncio.gather(*(SqliteDatabase(path).open() for _ in range(3)))
    try:
        for db in dbs:
            assert await db.schema_version() == len(MIGRATIONS)
        assert (await dbs[0].fetchone("SELECT COUNT(*) FROM schema_version"))[0] == len(MIGRATIONS)
    finally:
        for db in dbs:
            await db.close()


async def test_write_waits_for_busy_timeout_then_raises_database_error(tmp_path):
    db = await SqliteDatabase(tmp_path / "busy.db", busy_timeout_ms=200).open()
    other = sqlite3.connect(db.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="busy") as e:
            await db.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'x', 'y')")
        waited = time.monotonic() - started
        assert 0.15 <= waited < 3, waited
        assert "another process" in str(e.value)
        # reads are not blocked by a writer (WAL)
        assert (await db.fetchone("SELECT COUNT(*) FROM audit"))[0] == 0
        other.execute("COMMIT")
        await db.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'x', 'y')")
        assert (await db.fetchone("SELECT COUNT(*) FROM audit"))[0] == 1
    finally:
        other.close()
        await db.close()


async def test_write_proceeds_when_the_lock_is_released_within_the_timeout(tmp_path):
    db = await SqliteDatabase(tmp_path / "busy.db", busy_timeout_ms=3000).open()
    other = sqlite3.connect(db.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        asyncio.get_running_loop().call_later(0.2, lambda: other.execute("COMMIT"))
        await db.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'x', 'y')")
        assert (await db.fetchone("SELECT COUNT(*) FROM audit"))[0] == 1
    finally:
        other.close()
        await db.close()


async def test_open_while_another_process_writes(tmp_path):
    path = tmp_path / "e.db"
    await (await SqliteDatabase(path).open()).close()
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        db = await SqliteDatabase(path, busy_timeout_ms=200).open()    # nothing to migrate: no write needed
        try:
            assert await db.schema_version() == len(MIGRATIONS)
        finally:
            await db.close()
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_transactions_of_one_database_never_interleave(db):
    async def writer(i: int) -> None:
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (?, ?, 'start')", (i, str(i)))
            await asyncio.sleep(0)
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (?, ?, 'end')", (i, str(i)))

    await asyncio.gather(*(writer(i) for i in range(10)))
    actors = [r["actor"] for r in await db.fetchall("SELECT actor FROM audit ORDER BY id")]
    assert [actors[i] == actors[i + 1] for i in range(0, 20, 2)] == [True] * 10


async def test_error_inside_transaction_rolls_back(db):
    with pytest.raises(RuntimeError):
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'x', 'y')")
            raise RuntimeError("boom")
    assert (await db.fetchone("SELECT COUNT(*) FROM audit"))[0] == 0


async def test_backup_is_a_consistent_copy(db, tmp_path):
    await SessionStore(db).append_user(Scope("ou_a", "oc_a", "p2p"), "backed up")
    await db.backup_to(tmp_path / "backup" / "copy.db")
    copy = sqlite3.connect(str(tmp_path / "backup" / "copy.db"))
    try:
        assert copy.execute("SELECT content FROM messages").fetchall() == [("backed up",)]
    finally:
        copy.close()


def _two_rows(conn, tag: str) -> int:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'first')", (tag,))
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, ?, 'second')", (tag,))
    return conn.execute("SELECT COUNT(*) FROM audit WHERE actor = ?", (tag,)).fetchone()[0]


def _fail_after_one(conn) -> None:
    conn.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'half', 'first')")
    raise RuntimeError("boom")


async def test_write_runs_a_whole_transaction_in_one_round_trip(db):
    with counting_round_trips(db) as trips:
        assert await db.write(_two_rows, "w") == 2
    assert trips["n"] == 1
    assert await db.read(lambda conn: conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]) == 2
    with pytest.raises(RuntimeError):
        await db.write(_fail_after_one)
    assert (await db.fetchone("SELECT COUNT(*) FROM audit WHERE actor = 'half'"))[0] == 0   # rolled back


async def test_write_inside_a_transaction_joins_it_and_reads_wait_for_it(db):
    seen: list[int] = []

    async def reader() -> None:
        seen.append(await db.read(lambda conn: conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0]))

    async with db.transaction() as tx:
        await tx.execute("INSERT INTO audit(at, actor, action) VALUES (0, 'outer', 'x')")
        assert await db.write(_two_rows, "inner") == 2        # joined: no nested BEGIN
        task = asyncio.create_task(reader())
        await asyncio.sleep(0.05)
        assert not seen                                     # another task waits for the commit
    await task
    assert seen == [3]


async def test_wal_is_checkpointed_in_the_background_not_by_commits(tmp_path):
    """Commits no longer checkpoint by themselves (that pause sat on the one SQLite thread every
    query waits for); the background checkpointer keeps the WAL from growing instead."""
    db = await SqliteDatabase(tmp_path / "wal.db").open()
    try:
        await db.start_checkpointer(interval=0.05)
        assert (await db.fetchone("PRAGMA wal_autocheckpoint"))[0] == storage.sqlite.BACKSTOP_CHECKPOINT_PAGES
        blob = "x" * 4000
        for _ in range(12):                       # ~12 × 500 KB, with time for checkpoints between (a loaded CI machine may delay the thread)
            await db.executemany("INSERT INTO audit(at, actor, action, detail) VALUES (0, 'a', 'b', ?)",
                                 [(blob,)] * 125)
            await asyncio.sleep(0.4)
        wal = (tmp_path / "wal.db-wal").stat().st_size
        assert wal < 2_000_000, wal               # restarted from the top, not 6 MB of frames
    finally:
        await db.close()
    assert db._checkpointer is None


@pytest.fixture
def backend() -> str:
    """SQLite's own file, pragmas and locking: tests/memory/test_pg.py covers PostgreSQL's."""
    return "sqlite"
