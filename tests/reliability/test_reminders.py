"""Reminders at the wire (issue 27): ``ethan serve`` as a subprocess against the fake Lark,
jobs due a few seconds out (stored through the schedule store in the server's database, as
the schedule_message tool stores them).

- a one-shot in p2p arrives once, as a new message (not a reply), at its time;
- SIGKILL just before the due time → delivered once after the restart, marked late;
- ``/reminders`` lists it, ``/reminders cancel <id>`` stops it;
- a group reminder @-mentions its owner.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from storage.sqlite import SqliteDatabase
from memory.schedules.store import ScheduleStore
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import post_event, sqlite_rows, wait_until

pytestmark = pytest.mark.timeout(180)
TZ = "Asia/Shanghai"


async def _add(home, seconds: float, text: str, *, chat_id="oc_p2p_rem", chat_type="p2p", owner="ou_alice"):
    """A job due ``seconds`` from now (whole seconds, as a user would set it)."""
    db = await SqliteDatabase(home / "ethan.db").open()
    try:
        due = int(time.time() + seconds) + 1
        local = datetime.fromtimestamp(due, ZoneInfo(TZ)).replace(tzinfo=None).isoformat()
        job = await ScheduleStore(db).add(owner_id=owner, chat_id=chat_id, chat_type=chat_type, text=text,
                                          tz=TZ, dtstart=local)
        return job
    finally:
        await db.close()


def _sent(lark, chat_id):
    return [m for m in lark.messages(chat_id=chat_id) if m.kind == "create"]


async def test_a_one_shot_in_p2p_arrives_once_at_its_time(tmp_path, server, lark):
    home = tmp_path / "home"
    srv = server(home)
    await srv.start_ready()
    await srv.terminate()          # migrated; the job is stored while it is down, then it starts
    job = await _add(home, 20, "给客户回电话")      # due after a start slowed by load
    await srv.start_ready()
    await wait_until(lambda: _sent(lark, "oc_p2p_rem"), 30, "the reminder")
    [msg] = _sent(lark, "oc_p2p_rem")
    assert msg.reply_to is None and msg.text == "给客户回电话"           # a new message, the stored text
    assert job.next_due - 0.01 <= msg.at <= job.next_due + 5             # at its time, not before
    assert msg.uuid == f"rem-{job.id}-{int(job.next_due)}"
    await asyncio.sleep(2)
    assert len(_sent(lark, "oc_p2p_rem")) == 1
    [row] = sqlite_rows(srv.db_path, "SELECT status, lark_message_id FROM schedule_deliveries")
    assert (row["status"], row["lark_message_id"]) == ("sent", msg.message_id)
    [state] = sqlite_rows(srv.db_path, "SELECT state FROM schedules")
    assert state["state"] == "done"
    assert not srv.errors()


async def test_sigkill_just_before_the_due_time_delivers_once_after_restart_marked_late(tmp_path, server, lark):
    home = tmp_path / "home"
    srv = server(home)
    await srv.start_ready()
    await srv.terminate()
    job = await _add(home, 20, "call the client")    # far enough for a slow start under load
    await srv.start_ready()
    await wait_until(lambda: time.time() > job.next_due - 1.5, 30, "just before the due time")
    srv.kill()
    await wait_until(lambda: time.time() > job.next_due + 2, 30, "past the due time")
    assert _sent(lark, "oc_p2p_rem") == []
    await srv.start_ready()
    await wait_until(lambda: _sent(lark, "oc_p2p_rem"), 30, "the late reminder")
    await asyncio.sleep(2)
    [msg] = _sent(lark, "oc_p2p_rem")
    assert msg.text.startswith("call the client") and "Late reminder" in msg.text
    [row] = sqlite_rows(srv.db_path, "SELECT status, detail FROM schedule_deliveries")
    assert row["status"] == "late" and row["detail"].startswith("due ")


async def test_reminders_lists_and_cancel_stops_it_and_a_group_one_mentions_its_owner(tmp_path, server, lark):
    home = tmp_path / "home"
    srv = server(home)
    await srv.start_ready()
    await srv.terminate()
    cancelled = await _add(home, 25, "will be cancelled")
    kept = await _add(home, 25, "weekly report", chat_id="oc_group_rem", chat_type="group")
    await srv.start_ready()
    async with aiohttp.ClientSession() as http:
        async def command(text: str) -> str:
            ev = make_text_event(text, chat_id="oc_p2p_rem")
            mid = ev["event"]["message"]["message_id"]
            assert await post_event(http, srv.url, ev) == 200
            await wait_until(lambda: [m for m in lark.messages() if m.reply_to == mid], 20, text)
            return [m for m in lark.messages() if m.reply_to == mid][0].text

        listing = await command("/reminders")
        assert f"#{cancelled.id}" in listing and f"#{kept.id}" in listing
        assert f"Cancelled reminder #{cancelled.id}" in await command(f"/reminders cancel {cancelled.id}")
    await wait_until(lambda: _sent(lark, "oc_group_rem"), 30, "the group reminder")
    await asyncio.sleep(2)
    [group] = _sent(lark, "oc_group_rem")
    assert group.content["text"] == '<at user_id="ou_alice"></at> weekly report'
    assert _sent(lark, "oc_p2p_rem") == []                   # the cancelled one never came
    states = {r["id"]: r["state"] for r in sqlite_rows(srv.db_path, "SELECT id, state FROM schedules")}
    assert states == {cancelled.id: "cancelled", kept.id: "done"}
