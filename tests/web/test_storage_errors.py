"""A console or /chat request that meets a database error answers 503 with Retry-After and one
``web.storage_error`` log line — not aiohttp's 500 and traceback (bot/web/errors.py). The fault
is real: another connection holds SQLite's write lock past the busy timeout, as a second
process (``ethan memory import``, a backup) would."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from storage.sqlite import BUSY_TIMEOUT_MS
from tests.reliability.support import LogCapture


@pytest.fixture
def logs():
    with LogCapture() as cap:
        yield cap


def _hold_write_lock(path: str) -> tuple[sqlite3.Connection, threading.Event]:
    conn = sqlite3.connect(path, timeout=10, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn, threading.Event()


async def test_a_write_the_database_refuses_is_a_503_then_works_once_it_is_free(console, logs):
    conn, _ = _hold_write_lock(console.app.settings.db_path)
    try:
        status, body = await console.call("POST", "/api/users/ou_alice/facts",
                                          {"content": "用户喜欢喝乌龙茶", "category": "preference"})
    finally:
        conn.rollback()
        conn.close()
    assert status == 503, (status, body)
    assert body == {"error": "storage is unavailable right now; try again shortly"}
    [line] = logs.events("web.storage_error")
    assert line["path"] == "/api/users/ou_alice/facts" and line["method"] == "POST" and "locked" in line["error"]
    # nothing half-written: the refused write left no fact, and the same request now succeeds
    assert (await console.app.db.fetchone("SELECT COUNT(*) AS n FROM facts"))["n"] == 0
    status, body = await console.call("POST", "/api/users/ou_alice/facts",
                                      {"content": "用户喜欢喝乌龙茶", "category": "preference"})
    assert status == 201, (status, body)
    assert await console.app.db.integrity_check() == "ok"


async def test_the_503_says_when_to_come_back(console):
    # a fact to delete (an unknown id is a 404 before any write: /forget reads it first)
    status, body = await console.call("POST", "/api/users/ou_alice/facts",
                                      {"content": "用户喜欢喝乌龙茶", "category": "preference"})
    assert status == 201, (status, body)
    conn, _ = _hold_write_lock(console.app.settings.db_path)
    try:
        async with console.http.delete(console.url + f"/api/users/ou_alice/facts/{body['fact']['id']}") as r:
            status, retry_after = r.status, r.headers.get("Retry-After")
    finally:
        conn.rollback()
        conn.close()
    assert BUSY_TIMEOUT_MS < 30_000
    assert (status, retry_after) == (503, "5")
