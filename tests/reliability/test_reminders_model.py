"""The model's schedule_message tool at the wire (``ethan serve``, real webhook, the fake
Anthropic calling the tool): a time in the past or beyond the limit is refused with a clear
answer the model passes on; an accepted one wakes the scheduler and arrives at its time."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, last_user_text, running_model, tool_results
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import ServerProcess, post_event, sqlite_rows, wait_until

pytestmark = pytest.mark.timeout(180)
TZ = "Asia/Shanghai"
DUE: dict[str, int] = {}
SEEN: dict[str, str] = {}


def _local(t: float) -> str:
    return datetime.fromtimestamp(t, ZoneInfo(TZ)).replace(tzinfo=None).isoformat(timespec="seconds")


def responder(req: dict):
    results = tool_results(req)
    if results:       # say what the tool answered (refusal or confirmation)
        content = results[0].get("content")
        text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content or [])
        return Text(f"tool said: {text}")
    said = last_user_text(req)
    if said.startswith("[scheduled message]"):      # the reminder being written at its time
        system = " ".join(b.get("text", "") for b in req.get("system") or [] if isinstance(b, dict))
        SEEN["system"] = system
        return Text("早上好！今天的清单：给客户回电话" if "客户姓王" in system else "no memory seen")
    if "list today" in said:
        DUE["c"] = int(time.time()) + 6
        return ToolUse("schedule_message", {"text": "what's on my list today", "at": _local(DUE["c"]),
                                            "compose": True})
    if "yesterday" in said:
        return ToolUse("schedule_message", {"text": "call", "at": _local(time.time() - 86400)})
    if "in two years" in said:
        return ToolUse("schedule_message", {"text": "call", "at": _local(time.time() + 2 * 366 * 86400)})
    DUE["t"] = int(time.time()) + 6
    return ToolUse("schedule_message", {"text": "给客户回电话", "at": _local(DUE["t"])})


@pytest.fixture
def model():
    with running_model(responder) as fake:
        yield fake


async def test_refused_past_and_too_far_then_one_arrives_at_its_time(tmp_path, lark, model):
    srv = ServerProcess(tmp_path / "home", lark, model)
    try:
        await srv.start_ready()
        async with aiohttp.ClientSession() as http:
            async def ask(text: str) -> str:
                ev = make_text_event(text, chat_id="oc_p2p_tool")
                mid = ev["event"]["message"]["message_id"]
                assert await post_event(http, srv.url, ev) == 200
                await wait_until(lambda: [m for m in lark.messages() if m.reply_to == mid], 30, text)
                return [m for m in lark.messages() if m.reply_to == mid][0].text

            past = await ask("remind me yesterday")
            assert "in the past" in past and "it is now" in past
            far = await ask("remind me in two years")
            assert "more than 366 days ahead" in far
            assert sqlite_rows(srv.db_path, "SELECT COUNT(*) AS n FROM schedules")[0]["n"] == 0
            ok = await ask("提醒我六秒后给客户回电话")
            assert "scheduled reminder #1" in ok
        await wait_until(lambda: [m for m in lark.messages(chat_id="oc_p2p_tool") if m.kind == "create"],
                         30, "the reminder")
        [msg] = [m for m in lark.messages(chat_id="oc_p2p_tool") if m.kind == "create"]
        assert msg.text == "给客户回电话" and DUE["t"] - 0.01 <= msg.at <= DUE["t"] + 5   # woken on insert
        await asyncio.sleep(1)
        assert len([m for m in lark.messages(chat_id="oc_p2p_tool") if m.kind == "create"]) == 1
    finally:
        srv.close()


async def test_a_composed_reminder_is_written_by_the_model_with_the_owners_memory(tmp_path, lark, model):
    from storage.sqlite import SqliteDatabase
    from memory.facts.store import FactStore
    from memory.scope import Scope

    srv = ServerProcess(tmp_path / "home", lark, model)
    try:
        await srv.start_ready()
        await srv.terminate()
        db = await SqliteDatabase(srv.db_path).open()
        try:
            await FactStore(db).add(Scope(user_id="ou_alice", chat_id="oc_p2p_c", chat_type="p2p"),
                                    "用户的客户姓王", "knowledge", source="user_edit")
        finally:
            await db.close()
        await srv.start_ready()
        async with aiohttp.ClientSession() as http:
            ev = make_text_event("remind me what's on my list today", chat_id="oc_p2p_c")
            assert await post_event(http, srv.url, ev) == 200
        await wait_until(lambda: [m for m in lark.messages(chat_id="oc_p2p_c") if m.kind == "create"], 40,
                         "the composed reminder")
        [msg] = [m for m in lark.messages(chat_id="oc_p2p_c") if m.kind == "create"]
        assert msg.text == "早上好！今天的清单：给客户回电话"        # the model's words, with Alice's memory
    finally:
        srv.close()
