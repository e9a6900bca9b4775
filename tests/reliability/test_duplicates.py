"""Duplicates (issue item 2): Lark redelivers (15 s, 5 min, 1 h, 6 h) and may deliver twice
even on success. The same event five times before and five times after a restart, some of
them concurrently, and the same message under a second event id: one reply, one model
conversation, one memory write.

One memory write is checked on the facts table *and* on the fact's reinforcement counter:
FactStore turns a second identical write into a reinforcement (``hit_count``), so a
duplicate run of the tool would not add a row — it would bump the counter.
"""

from __future__ import annotations

import asyncio
import copy

from tests.fakes.fake_anthropic import Delay, Text, ToolUse, tool_results
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness
from tests.reliability.support import deliveries_by_trigger

FACT = "Alice 最喜欢的茶是凤凰单丛"


def _remembering(req: dict):
    """Every fresh question -> a memory_write; after the tool result -> the answer. A second
    run of the same message would therefore write (reinforce) the fact a second time."""
    if tool_results(req):
        return Text("记住了：凤凰单丛。")
    return ToolUse("memory_write", {"content": FACT, "category": "preference"})


def _with_new_event_id(event: dict, event_id: str) -> dict:
    twin = copy.deepcopy(event)
    twin["header"]["event_id"] = event_id
    return twin


async def _facts(h) -> list:
    return await h.app.db.fetchall("SELECT content, hit_count, confidence FROM facts")


async def test_redelivered_event_and_twin_event_id_one_reply_one_write(tmp_path, logs):
    event = make_text_event("记住：我最喜欢的茶是凤凰单丛", chat_id="oc_p2p_alice", sender="ou_alice")
    mid = event["event"]["message"]["message_id"]
    async with Harness(tmp_path) as h:
        h.model.responder = _remembering
        # Five deliveries before the restart: two one after the other, three at once.
        assert (await h.post(event))[0] == 200
        assert (await h.post(event))[0] == 200
        statuses = await asyncio.gather(*(h.post(event) for _ in range(3)))
        assert [s for s, _ in statuses] == [200, 200, 200]
        # The same message under another event id (Lark re-sent it as a new event).
        assert (await h.post(_with_new_event_id(event, "ev_twin_1")))[0] == 200
        await h.replies(1)
        await h.idle()

        await h.restart()
        # Five more after the restart, and the twin again, and a third event id.
        for _ in range(2):
            assert (await h.post(event))[0] == 200
        statuses = await asyncio.gather(*(h.post(event) for _ in range(3)),
                                        h.post(_with_new_event_id(event, "ev_twin_1")),
                                        h.post(_with_new_event_id(event, "ev_twin_2")))
        assert all(s == 200 for s, _ in statuses)
        await h.idle()
        await asyncio.sleep(0.3)

        assert deliveries_by_trigger(h.lark) == {mid: 1}
        assert [m.text for m in h.lark.messages()] == ["记住了：凤凰单丛。"]
        assert len(h.model.chat_requests()) == 2            # tool round + answer, once
        rows = await _facts(h)
        assert [(r["content"], r["hit_count"]) for r in rows] == [(FACT, 0)]
        inbox = await h.app.db.fetchall("SELECT event_id, status FROM inbox")
        assert [(r["event_id"], r["status"]) for r in inbox] == [(event["header"]["event_id"], "done")]
        users = await h.app.db.fetchall("SELECT id FROM messages WHERE role = 'user'")
        assert len(users) == 1
    assert not logs.errors(), logs.errors()[:3]


async def test_redelivery_while_the_first_delivery_is_still_being_answered(tmp_path):
    """Lark's 15 s retry can arrive while the bot is still thinking about the first one."""
    event = make_text_event("记住：我最喜欢的茶是凤凰单丛", chat_id="oc_p2p_alice", sender="ou_alice")
    async with Harness(tmp_path) as h:
        slow = {"n": 0}

        def responder(req):
            slow["n"] += 1
            inner = _remembering(req)
            return Delay(1.0, inner) if slow["n"] == 1 else inner

        h.model.responder = responder
        assert (await h.post(event))[0] == 200
        await h.model.wait_for_requests_async(1, timeout=30)   # the model is working on it
        for _ in range(4):
            assert (await h.post(event))[0] == 200
        assert (await h.post(_with_new_event_id(event, "ev_retry_twin")))[0] == 200
        await h.replies(1, timeout=10)
        await h.idle()
        await asyncio.sleep(0.3)
        assert len(h.lark.messages()) == 1
        assert len(h.model.chat_requests()) == 2
        assert [(r["content"], r["hit_count"]) for r in await _facts(h)] == [(FACT, 0)]


async def test_redelivery_after_a_restart_that_cut_the_answer_short(tmp_path):
    """Stored and being answered when the bot stopped (deadline passed, work cancelled):
    the restart answers it once; redeliveries after that add nothing."""
    event = make_text_event("记住：我最喜欢的茶是凤凰单丛", chat_id="oc_p2p_alice", sender="ou_alice")
    async with Harness(tmp_path, ethan_shutdown_deadline=0.5) as h:
        h.model.responder = lambda req: Delay(30, Text("never"))
        assert (await h.post(event))[0] == 200
        await h.model.wait_for_requests_async(1, timeout=30)   # being answered (not a fixed sleep)
        await h.stop_app()                               # cancelled: still pending
        h.model.responder = _remembering
        await h.start_app()                              # answered from the inbox
        await h.replies(1, timeout=10)
        for _ in range(5):
            assert (await h.post(event))[0] == 200
        await h.idle()
        await asyncio.sleep(0.3)
        assert len(h.lark.messages()) == 1
        assert [(r["content"], r["hit_count"]) for r in await _facts(h)] == [(FACT, 0)]
        users = await h.app.db.fetchall("SELECT id FROM messages WHERE role = 'user'")
        assert len(users) == 1
