"""`ethan db copy --to postgresql://…`: SQLite into PostgreSQL, idempotent, counts verified;
the round trip SQLite → PostgreSQL → `ethan memory export` gives the same files per user."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bot.infra.cli import main
from storage.schema.postgres import PG_ONLY_TABLES
from storage import database
from storage.sqlite import SqliteDatabase
from tests.test_export import ALICE, BOB, fill
from memory.sessions.store import SessionStore
from memory.scope import Scope


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.upper().startswith(("ETHAN_", "LARK_", "ANTHROPIC_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ETHAN_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


async def _seed(path: Path) -> None:
    db = await SqliteDatabase(path).open()
    try:
        await fill(db)
        sessions = SessionStore(db)
        for i in range(3):
            s = Scope(user_id=ALICE, chat_id="oc_alice_dm", chat_type="p2p", message_id=f"om_{i}")
            res = await sessions.append_user(s, f"第 {i} 条消息 about release")
            await sessions.append_assistant(res.session.id, f"reply {i}")
    finally:
        await db.close()


async def _table_counts(target) -> dict[str, int]:
    db = await database(target).open()
    try:
        return {t: (await db.fetchone(f'SELECT COUNT(*) FROM "{t}"'))[0] for t in await db.table_columns()
                if t != "schema_version" and t not in PG_ONLY_TABLES}
    finally:
        await db.close()


def _export(user: str, out: Path) -> dict[str, str]:
    assert main(["memory", "export", "--user", user, "--out", str(out)]) == 0
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def test_copy_round_trip_is_identical_per_user(home, tmp_path, pg_cluster, monkeypatch, capsys):
    asyncio.run(_seed(home / "ethan.db"))
    url = pg_cluster.new_database()
    assert main(["db", "copy", "--to", url]) == 0
    first = capsys.readouterr().out
    assert "counts verified" in first
    # Again: nothing new, the same counts (idempotent).
    assert main(["db", "copy", "--to", url]) == 0
    assert "0 new rows" in capsys.readouterr().out
    assert asyncio.run(_table_counts(url)) == asyncio.run(_table_counts(home / "ethan.db"))

    from_sqlite = {u: _export(u, tmp_path / f"sqlite-{u}") for u in (ALICE, BOB)}
    monkeypatch.setenv("ETHAN_DATABASE_URL", url)
    from_pg = {u: _export(u, tmp_path / f"pg-{u}") for u in (ALICE, BOB)}
    assert from_pg == from_sqlite
    assert all(from_sqlite[u] for u in (ALICE, BOB))

    # The copied database goes on: new rows get new ids, counters stay right.
    async def more() -> None:
        db = await database(url).open()
        try:
            s = Scope(user_id=BOB, chat_id="oc_bob_dm", chat_type="p2p", message_id="om_new")
            res = await SessionStore(db).append_user(s, "after the move")
            assert res.message.id > 0
            sessions = await db.fetchall("SELECT message_count, user_turns FROM sessions ORDER BY id")
            assert sorted(tuple(r) for r in sessions) == [(1, 1), (6, 3)]
        finally:
            await db.close()
    asyncio.run(more())


def test_copy_refuses_a_target_holding_another_database(home, pg_cluster, capsys):
    asyncio.run(_seed(home / "ethan.db"))
    url = pg_cluster.new_database()

    async def other() -> None:
        db = await database(url).open()
        try:
            await db.execute("INSERT INTO modes(user_id, conv_key, mode, updated_at) VALUES ('ou_x', 'c', 'work', 1)")
        finally:
            await db.close()
    asyncio.run(other())
    assert main(["db", "copy", "--to", url]) != 0
    assert "row counts differ" in capsys.readouterr().err
    assert asyncio.run(_table_counts(url))["facts"] == 0    # rolled back: nothing half-copied


async def test_the_copy_knows_every_table_of_the_schema(tmp_path):
    """A table added by a migration but missing from memory.governance.copy.ORDER would silently stay
    behind when a team moves to PostgreSQL."""
    from memory.governance.copy import ORDER

    db = await SqliteDatabase(tmp_path / "t.db").open()
    try:
        tables = set(await db.table_columns()) - {"schema_version"}
    finally:
        await db.close()
    assert tables - set(ORDER) == set(), "add these tables to memory/governance/copy.py ORDER"
    assert set(ORDER) - tables == set()
