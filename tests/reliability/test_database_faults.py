"""Issue 17, Medium 3: an acknowledged message whose handling hits a database error.

Another process holding SQLite's write lock (``BEGIN IMMEDIATE`` on the same file) past the
busy timeout, or a full disk, made the handler fail; the row stayed ``pending`` with no retry
in the running process and no word to the user. Now it is handled again in-process with
backoff (bot/delivery/redelivery.py, ``Redelivery.handle``), the user is told when it takes long, and the log
lines carry the ids. The faults are real: a second connection on the file, a full tmpfs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import threading
import time

import pytest

from storage.sqlite import BUSY_TIMEOUT_MS
from tests.fakes.fake_anthropic import Text
from tests.harness import Harness
from tests.reliability.support import deliveries_by_trigger, wait_until


class LockWhileAnswering:
    """The fake model's chat responder: on the first chat request it takes the database's
    write lock from another connection (as a second process would) and releases it after
    ``hold`` seconds; the app's next write (the assistant turn) waits out its busy timeout."""

    def __init__(self, db_path, hold: float) -> None:
        self.db_path, self.hold = str(db_path), hold
        self.locked = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def __call__(self, req: dict):
        self.calls += 1
        if self.calls == 1:
            conn = sqlite3.connect(self.db_path, timeout=10, check_same_thread=False)
            conn.execute("BEGIN IMMEDIATE")
            self.locked.set()

            def release() -> None:
                time.sleep(self.hold)
                conn.rollback()
                conn.close()
                self.released.set()

            threading.Thread(target=release, daemon=True).start()
        return Text("好的，记下了。")


def _chat(req: dict) -> bool:
    return not req.get("tools") or all(t.get("name") != "write_summary" for t in req.get("tools", []))


async def _lock_case(tmp_path, logs, *, notice_after: float):
    hold = BUSY_TIMEOUT_MS / 1000 + 2          # past the busy timeout: a real "database is locked"
    async with Harness(tmp_path) as h:
        h.app.redelivery.db_notice_after_s = notice_after
        responder = LockWhileAnswering(h.app.settings.db_path, hold)
        h.model.on(lambda req: True, responder)
        ev = await h.send_text("请记住我明天去上海")
        mid = ev["event"]["message"]["message_id"]
        await wait_until(lambda: responder.released.is_set(), hold + 5, "the lock to be released")
        await wait_until(lambda: any(m.text == "好的，记下了。" for m in h.lark.messages()), 30, "the answer")
        await h.idle()
        row = await h.app.db.fetchone("SELECT status FROM inbox WHERE message_id = ?", (mid,))
        assert row["status"] == "done"
        errors = logs.events("handle.db_error")
        assert errors and all(e["message_id"] == mid and e["event_id"] == ev["header"]["event_id"]
                              and e["chat_id"] == "oc_p2p_alice" and e["retry_in_s"] for e in errors), errors
        assert "locked" in errors[0]["error"]
        assert logs.events("handle.db_recovered")[0]["message_id"] == mid
        # The session holds the turn once and its answer once (the retry did not double them).
        roles = [r["role"] for r in await h.app.db.fetchall("SELECT role FROM messages ORDER BY id")]
        assert roles == ["user", "assistant"], roles
        assert await h.app.db.integrity_check() == "ok"
        return h, mid


async def test_write_lock_held_past_the_busy_timeout_is_retried_and_answered(tmp_path, logs):
    h, mid = await _lock_case(tmp_path, logs, notice_after=60.0)
    texts = [m.text for m in h.lark.messages()]
    assert texts == ["好的，记下了。"], texts                      # quick recovery: no notice
    assert deliveries_by_trigger(h.lark) == {mid: 1}


async def test_a_long_database_outage_tells_the_user_then_answers(tmp_path, logs):
    h, mid = await _lock_case(tmp_path, logs, notice_after=0.5)
    texts = [m.text for m in h.lark.messages()]
    assert len(texts) == 2 and "存储" in texts[0] and texts[1] == "好的，记下了。", texts
    assert logs.events("handle.user_told")[0]["message_id"] == mid


def _can_mount_tmpfs(path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


async def test_a_full_disk_is_retried_and_answered_once_space_returns(tmp_path, logs):
    home = tmp_path / "small"
    home.mkdir()
    if not _can_mount_tmpfs(home):
        pytest.skip("needs root and tmpfs to make a genuinely full filesystem")
    try:
        async with Harness(home) as h:
            filler = home / "filler"
            state = {"calls": 0}

            def fill_disk(req: dict):
                state["calls"] += 1
                if state["calls"] == 1:
                    with open(filler, "wb") as f:       # every free byte of the filesystem
                        try:
                            while True:
                                f.write(b"\0" * 65536)
                                f.flush()
                        except OSError:
                            pass
                    threading.Timer(3.0, lambda: filler.unlink(missing_ok=True)).start()
                return Text("磁盘满了也能回答。" + "长" * 3000)   # the assistant turn needs new pages

            h.model.on(lambda req: True, fill_disk)
            ev = await h.send_text("磁盘满的时候你还在吗")
            mid = ev["event"]["message"]["message_id"]
            await wait_until(lambda: any(m.text.startswith("磁盘满了也能回答") for m in h.lark.messages()), 40,
                             "the answer after the disk has room again")
            await h.idle()
            assert (await h.app.db.fetchone("SELECT status FROM inbox WHERE message_id = ?", (mid,)))["status"] == "done"
            errors = logs.events("handle.db_error")
            assert errors and errors[0]["message_id"] == mid and "full" in errors[0]["error"], errors
            assert await h.app.db.integrity_check() == "ok"
    finally:
        subprocess.run(["umount", "-l", str(home)], capture_output=True)


async def test_database_errors_until_the_30_minute_rule_end_with_a_word_to_the_user(tmp_path, logs):
    """A message whose handling keeps failing is not dropped silently when the 30-minute rule
    ends it: the user is told, the row is finished, the log says so with its ids."""
    async with Harness(tmp_path) as h:
        h.app.redelivery.db_retry_delays_s = (0.2,)
        conn = sqlite3.connect(str(h.app.settings.db_path), timeout=10, check_same_thread=False)
        # Created 29 min 59 s ago: accepted, and the first retry would pass the 30-minute mark.
        ev = await h.send_text("快过期的消息", create_time_ms=int((time.time() - 30 * 60 + 1.5) * 1000))
        mid = ev["event"]["message"]["message_id"]
        await asyncio.sleep(0)
        conn.execute("BEGIN IMMEDIATE")                      # held until the end
        try:
            await wait_until(lambda: logs.events("handle.db_gave_up"), 60, "handle.db_gave_up")
            await wait_until(lambda: any("再发一次" in m.text for m in h.lark.messages()), 10, "the apology")
        finally:
            conn.rollback()
            conn.close()
        gave_up = logs.events("handle.db_gave_up")[0]
        assert gave_up["message_id"] == mid and gave_up["event_id"] == ev["header"]["event_id"]
        for _ in range(100):                                  # finished once the lock is gone
            row = await h.app.db.fetchone("SELECT status, note FROM inbox WHERE message_id = ?", (mid,))
            if row["status"] != "pending":
                break
            await asyncio.sleep(0.1)
        assert (row["status"], row["note"]) == ("failed", "database error for 30 minutes")
