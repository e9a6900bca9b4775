"""Lark's rules for what the bot answers (DESIGN.md §5, issue: chat behaviour), at the wire."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fakes.fake_anthropic import Text, last_user_text
from tests.fakes.lark_events import load_fixture, make_text_event
from tests.harness import Harness

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends


async def _quiet(h, seconds: float = 0.3) -> None:
    await h.idle()
    await asyncio.sleep(seconds)


async def test_group_without_mention_gets_no_reply_and_no_model_call(tmp_path):
    async with Harness(tmp_path) as h:
        assert (await h.post(load_fixture("group_no_mention", fresh_ids=True)))[0] == 200
        await _quiet(h)
        assert h.lark.messages() == [] and h.model.requests == []


async def test_group_mention_by_open_id_only(tmp_path):
    async with Harness(tmp_path) as h:
        # A mention whose *name* is the bot's but whose open_id is someone else's is not for us.
        fake = {"key": "@_user_1", "id": {"open_id": "ou_impostor", "union_id": "", "user_id": ""},
                "name": "Ethan", "mentioned_type": "user", "tenant_key": "tk_demo"}
        await h.post(make_text_event("@_user_1 hello", chat_id="oc_group_1", chat_type="group", mentions=[fake]))
        await _quiet(h)
        assert h.lark.messages() == [] and h.model.requests == []
        h.model.script(Text("group answer"))
        await h.post(load_fixture("group_mention", fresh_ids=True))
        [reply] = await h.replies(1)
        assert reply.text == "group answer"
        # The bot's placeholder is stripped and other mentions are turned back into names.
        [req] = h.model.chat_requests()
        last = h.model.user_texts(req)[-1]
        assert "@_user" not in last and "@Bob" in last and "帮我和" in last


async def test_at_all_is_off_by_default_and_on_when_configured(tmp_path):
    async with Harness(tmp_path) as h:
        await h.post(load_fixture("group_at_all", fresh_ids=True))
        await _quiet(h)
        assert h.lark.messages() == [] and h.model.requests == []
    async with Harness(tmp_path / "all", ethan_respond_to_all=True) as h:
        h.model.script(Text("收到"))
        await h.post(load_fixture("group_at_all", fresh_ids=True))
        [reply] = await h.replies(1)
        assert reply.text == "收到"


async def test_messages_from_bots_are_ignored(tmp_path):
    async with Harness(tmp_path) as h:
        await h.post(load_fixture("from_bot", fresh_ids=True))
        # Its own messages too (sender is the bot's open_id), even if typed as a user.
        await h.post(make_text_event("echo", chat_id="oc_p2p_alice", sender="ou_bot"))
        await h.post(make_text_event("hi", chat_id="oc_p2p_alice", sender_type="app"))
        await _quiet(h)
        assert h.lark.messages() == [] and h.model.requests == []


async def test_messages_older_than_30_minutes_are_not_answered(tmp_path):
    async with Harness(tmp_path) as h:
        old = int((time.time() - 31 * 60) * 1000)
        await h.post(make_text_event("still there?", chat_id="oc_p2p_alice", create_time_ms=old))
        await _quiet(h)
        assert h.lark.messages() == [] and h.model.requests == []
        row = await h.app.db.fetchone("SELECT status FROM inbox")
        assert row["status"] == "ignored"   # stored for dedup, not answered


async def test_topic_thread_is_its_own_conversation_and_answered_in_thread(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("re: " + h.model.user_texts(req)[-1])
        await h.send_text("main chat question", chat_id="oc_group_1", chat_type="group")
        await h.replies(1)
        await h.send_text("thread question", chat_id="oc_group_1", chat_type="group",
                          thread_id="omt_topic_1", root_id="om_root_1")
        replies = await h.replies(2)
        assert replies[1].reply_in_thread is True and replies[0].reply_in_thread is False
        rows = await h.app.db.fetchall("SELECT conv_key FROM sessions ORDER BY created_at")
        assert [r["conv_key"] for r in rows] == ["oc_group_1", "oc_group_1#omt_topic_1"]
        # The thread's context does not carry the main chat's turns.
        thread_req = h.model.chat_requests()[-1]
        assert not any("main chat question" in t for t in h.model.user_texts(thread_req))


async def test_non_text_messages_get_a_short_polite_answer(tmp_path):
    async with Harness(tmp_path) as h:
        await h.post(load_fixture("image", fresh_ids=True))
        for kind, content in [("file", {"file_key": "f", "file_name": "a.pdf"}), ("audio", {"file_key": "a"}),
                              ("sticker", {"file_key": "s"}), ("share_chat", {"chat_id": "oc_x"})]:
            await h.post(make_text_event("", chat_id="oc_p2p_alice", message_type=kind, content=content))
        replies = await h.replies(5)
        assert all(r.text.startswith("抱歉") and len(r.text) < 80 for r in replies)
        assert h.model.requests == []


async def test_post_rich_text_is_read(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(Text("好的，下周一交付。"))
        await h.post(load_fixture("post", fresh_ids=True))
        await h.replies(1)
        text = h.model.user_texts(h.model.chat_requests()[0])[-1]
        assert "本周完成了" in text and "设计文档" in text and "请记住下周一交付" in text
        assert "[image]" in text and "@_user_1" not in text


async def test_empty_and_mention_only_messages_get_a_short_answer(tmp_path):
    async with Harness(tmp_path) as h:
        await h.send_text("   ", chat_id="oc_p2p_alice")
        await h.send_text("", chat_id="oc_group_1", chat_type="group")   # only "@Ethan"
        replies = await h.replies(2)
        assert all(r.text and len(r.text) < 40 for r in replies)
        assert h.model.requests == []


async def test_group_turns_are_labelled_by_speaker_and_memory_is_the_speakers(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("ok")
        await h.send_text("我负责后端", chat_id="oc_group_2", chat_type="group", sender="ou_alice")
        await h.replies(1)
        await h.send_text("我负责前端", chat_id="oc_group_2", chat_type="group", sender="ou_bob")
        await h.replies(2)
        req = h.model.chat_requests()[-1]
        texts = h.model.user_texts(req)
        # Replayed and current turns carry their speaker's label.
        assert texts[0].startswith("[") and "我负责后端" in texts[0]
        current = last_user_text(req.json)       # the user's words (the date block precedes them)
        assert current.startswith("[") and "我负责前端" in current
        assert texts[0].split("]")[0] != current.split("]")[0]
