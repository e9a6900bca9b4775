"""Hostile reminder rules at the wire (issue 45 N1, N7): ``ethan serve``, real signed webhook
events, the fake Anthropic calling ``schedule_message``.

- A rule that never occurs (``FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30``): before, finding its next
  time walked dateutil's iterator to the year 9999 on the event loop (7–20 s), and another
  chat's webhook waited as long for its acknowledgement (Lark allows 3 s). Now another chat is
  acknowledged within Lark's limit while it is being checked, and the user is told the rule
  never occurs; nothing is stored.
- "At most hourly" by the real occurrences: ``FREQ=HOURLY;BYMINUTE=0,…,59`` (a message a
  minute) and a daily rule whose first and last times of day are 30 min apart across midnight
  are refused; ``FREQ=MINUTELY;INTERVAL=90`` (every 90 minutes) is accepted.
- A per-chat cap: ``ETHAN_REMINDERS_PER_CHAT`` active reminders in a group, every member's
  together; the next member is refused with a clear answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, last_user_text, running_model, tool_results
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import POST_ERRORS, ServerProcess, bot_mention, post_event, sqlite_rows, wait_until

pytestmark = pytest.mark.timeout(240)
TZ = "Asia/Shanghai"
NEVER = "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30"
EVERY_MINUTE = "FREQ=HOURLY;BYMINUTE=" + ",".join(str(m) for m in range(60))
ACROSS_MIDNIGHT = "FREQ=DAILY;BYHOUR=0,23;BYMINUTE=0,30;BYSETPOS=1,-1"   # 00:00 and 23:30: 30 min apart
LARK_ACK_LIMIT_S = 3.0          # Lark re-sends an event not acknowledged within 3 s
RULES = {"never": NEVER, "every minute": EVERY_MINUTE, "midnight": ACROSS_MIDNIGHT,
         "ninety": "FREQ=MINUTELY;INTERVAL=90", "weekly": "FREQ=WEEKLY;BYDAY=MO"}
HOSTILE_SENT = threading.Event()


def _tomorrow_nine() -> str:
    d = datetime.fromtimestamp(time.time() + 86400, ZoneInfo(TZ))
    return d.replace(hour=9, minute=0, second=0, microsecond=0, tzinfo=None).isoformat(timespec="minutes")


def responder(req: dict):
    results = tool_results(req)
    if results:
        content = results[0].get("content")
        text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content or [])
        return Text(f"tool said: {text}")
    said = last_user_text(req)
    for key, rule in RULES.items():
        if f"rule:{key}" in said:
            if key == "never":
                HOSTILE_SENT.set()
            return ToolUse("schedule_message", {"text": f"ping {key}", "at": _tomorrow_nine(), "rrule": rule})
    return Text("hello")


@pytest.fixture
def model():
    HOSTILE_SENT.clear()
    with running_model(responder) as fake:
        yield fake


async def _answer(lark, http, url: str, text: str, *, chat_id: str, sender: str = "ou_alice",
                  chat_type: str = "p2p") -> str:
    ev = make_text_event(text, chat_id=chat_id, sender=sender, chat_type=chat_type,
                         mentions=[bot_mention()] if chat_type == "group" else None)
    mid = ev["event"]["message"]["message_id"]
    assert await post_event(http, url, ev) == 200
    await wait_until(lambda: [m for m in lark.messages() if m.reply_to == mid], 60, text)
    return [m for m in lark.messages() if m.reply_to == mid][0].text


async def test_a_rule_that_never_occurs_is_refused_and_another_chat_is_acknowledged_meanwhile(tmp_path, lark, model):
    srv = ServerProcess(tmp_path / "home", lark, model)
    try:
        await srv.start_ready()
        async with aiohttp.ClientSession() as http:
            assert await _answer(lark, http, srv.url, "hi", chat_id="oc_other") == "hello"     # warmed up
            hostile = make_text_event("remind me rule:never", chat_id="oc_hostile")
            hostile_mid = hostile["event"]["message"]["message_id"]
            assert await post_event(http, srv.url, hostile) == 200
            await wait_until(HOSTILE_SENT.is_set, 30, "the model's schedule_message call")
            await asyncio.sleep(0.3)          # the tool call has reached the server by now
            other = make_text_event("hello again", chat_id="oc_other")
            t0 = time.monotonic()
            status = await post_event(http, srv.url, other, timeout=LARK_ACK_LIMIT_S)
            assert status == 200, (f"another chat not acknowledged within Lark's {LARK_ACK_LIMIT_S:g} s "
                                   f"while the rule was checked: {POST_ERRORS[-1:]}, {time.monotonic() - t0:.1f} s")
            await wait_until(lambda: [m for m in lark.messages() if m.reply_to == hostile_mid], 60, "the refusal")
            [refusal] = [m.text for m in lark.messages() if m.reply_to == hostile_mid]
            assert "no occurrence" in refusal and "BYMONTHDAY=30" in refusal, refusal
        assert sqlite_rows(srv.db_path, "SELECT COUNT(*) AS n FROM schedules")[0]["n"] == 0
        [line] = [e for e in srv.entries() if e.get("event") == "reminder.refused"]
        assert line["reason"] == "never" and line["chat_id"] == "oc_hostile" and line["user_id"] == "ou_alice"
    finally:
        srv.close()


async def test_more_often_than_hourly_by_the_real_occurrences_is_refused(tmp_path, lark, model):
    srv = ServerProcess(tmp_path / "home", lark, model)
    try:
        await srv.start_ready()
        async with aiohttp.ClientSession() as http:
            minute = await _answer(lark, http, srv.url, "remind me rule:every minute", chat_id="oc_g1",
                                   chat_type="group")
            assert "at most hourly" in minute, minute
            midnight = await _answer(lark, http, srv.url, "remind me rule:midnight", chat_id="oc_g1",
                                     chat_type="group")
            assert "at most hourly" in midnight and "1800 s" in midnight, midnight
            ninety = await _answer(lark, http, srv.url, "remind me rule:ninety", chat_id="oc_g1", chat_type="group")
            assert "scheduled reminder #1" in ninety, ninety           # every 90 minutes: fine
        rows = sqlite_rows(srv.db_path, "SELECT rrule FROM schedules")
        assert [r["rrule"] for r in rows] == ["FREQ=MINUTELY;INTERVAL=90"]
        reasons = [e["reason"] for e in srv.entries() if e.get("event") == "reminder.refused"]
        assert reasons == ["too_often", "too_often"]
    finally:
        srv.close()


async def test_a_group_holds_at_most_the_per_chat_cap_of_reminders(tmp_path, lark, model):
    srv = ServerProcess(tmp_path / "home", lark, model, ETHAN_REMINDERS_PER_CHAT="2")
    try:
        await srv.start_ready()
        async with aiohttp.ClientSession() as http:
            for who in ("ou_alice", "ou_bob"):
                ok = await _answer(lark, http, srv.url, "remind me rule:weekly", chat_id="oc_team", sender=who,
                                   chat_type="group")
                assert "scheduled reminder" in ok, ok
            third = await _answer(lark, http, srv.url, "remind me rule:weekly", chat_id="oc_team",
                                  sender="ou_carol", chat_type="group")
            assert "this chat already has 2 active reminders" in third, third
            elsewhere = await _answer(lark, http, srv.url, "remind me rule:weekly", chat_id="oc_p2p_carol",
                                      sender="ou_carol")
            assert "scheduled reminder" in elsewhere, elsewhere       # the cap is the chat's, not Carol's
        rows = sqlite_rows(srv.db_path, "SELECT chat_id, COUNT(*) AS n FROM schedules GROUP BY chat_id ORDER BY chat_id")
        assert [(r["chat_id"], r["n"]) for r in rows] == [("oc_p2p_carol", 1), ("oc_team", 2)]
        [line] = [e for e in srv.entries() if e.get("event") == "reminder.refused"]
        assert line["reason"] == "chat_limit" and line["user_id"] == "ou_carol"
    finally:
        srv.close()
