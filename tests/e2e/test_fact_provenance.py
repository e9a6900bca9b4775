"""Fact provenance keeps all sources (issue 32 Low), at the wire: a fact Alice taught in her
direct chat and repeated in a group survives the group owner's recall of the group message
(and is private again: its only remaining source is private); the recall of its last source
removes it. Signed, encrypted webhook events (messages, recalls) through the app; the model's
memory_write calls scripted at the fake; both backends.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.fake_anthropic import Text, ToolUse
from tests.fakes.lark_events import make_recalled_event
from tests.harness import Harness

pytestmark = pytest.mark.app_backends

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
GROUP = dict(chat_id="oc_team_prov", chat_type="group", sender="ou_alice")
TEA = {"content": "用户喜欢喝乌龙茶", "category": "preference"}


async def _say(h, text, n, **where) -> str:
    h.model.script(ToolUse("memory_write", TEA), Text("记住了。"))
    ev = await h.send_text(text, **where)
    await h.replies(n)
    await h.idle()
    return ev["event"]["message"]["message_id"]


async def _recall(h, mid, chat_id) -> None:
    status, _ = await h.post(make_recalled_event(mid, chat_id=chat_id, recall_type="group_owner"))
    assert status == 200
    await h.idle()


async def _tea(h) -> list[dict]:
    return [dict(r) for r in await h.app.db.fetchall(
        "SELECT id, visibility, chat_id, message_id, hit_count FROM facts WHERE content = ?", (TEA["content"],))]


async def test_a_fact_learned_twice_survives_the_recall_of_one_source(tmp_path):
    async with Harness(tmp_path) as h:
        private = await _say(h, "记住：我喜欢喝乌龙茶", 1, **ALICE)
        in_group = await _say(h, "我喜欢喝乌龙茶", 2, **GROUP)
        [fact] = await _tea(h)
        assert fact["hit_count"] == 1 and fact["visibility"] == "shared"
        # repeating it did not move its provenance to the latest message
        assert fact["message_id"] == private and fact["chat_id"] == "oc_p2p_alice"

        # /memory in the direct chat names both places
        await h.send_text("/memory", **ALICE)
        card = json.dumps((await h.replies(3))[-1].content, ensure_ascii=False)
        await h.idle()
        assert private[-6:] in card and in_group[-6:] in card, card

        # the group owner recalls the group message: the fact Alice taught in private stays,
        # private again (not injected in the group any more)
        await _recall(h, in_group, "oc_team_prov")
        [fact] = await _tea(h)
        assert fact["visibility"] == "private" and fact["message_id"] == private
        h.model.script(Text("好的。"))
        await h.send_text("今天喝点什么", **GROUP)
        await h.replies(4)
        await h.idle()
        assert TEA["content"] not in json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)

        # the recall of its last source removes it
        await _recall(h, private, "oc_p2p_alice")
        assert await _tea(h) == []


async def test_the_recall_of_the_first_source_keeps_the_later_one(tmp_path):
    async with Harness(tmp_path) as h:
        first = await _say(h, "记住：我喜欢喝乌龙茶", 1, **ALICE)
        second = await _say(h, "再说一次，我喜欢喝乌龙茶", 2, **ALICE)
        await _recall(h, first, "oc_p2p_alice")
        [fact] = await _tea(h)
        assert fact["message_id"] == second        # the remaining source is its provenance now
        await _recall(h, second, "oc_p2p_alice")
        assert await _tea(h) == []
