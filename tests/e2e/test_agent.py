"""The agent through the fakes: memory tools land in the next request, failures end in
one apology, long answers stream into one card, the cacheable prefix never changes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.fakes.fake_anthropic import Error, Stall, Text, ToolUse, Turn
from bot.agent.prompt import MemoryBlocks, build_system
from tests.harness import Harness

pytestmark = [pytest.mark.usefixtures("model_provider"), pytest.mark.app_backends]

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
BOB = dict(chat_id="oc_p2p_bob", sender="ou_bob")


def system_of(h, req) -> str:
    return h.model.last_system_text(req)


async def _turn(h, text, n, **who):
    await h.send_text(text, **who)
    await h.replies(n)
    await h.idle()


async def test_memory_write_lands_in_the_next_request(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("memory_write", {"content": "Alice 喜欢喝乌龙茶", "category": "preference"}),
            Text("记住了。"),
            Text("你喜欢乌龙茶。"),
        )
        await _turn(h, "记住：我喜欢喝乌龙茶", 1, **ALICE)
        await _turn(h, "我喜欢喝什么？", 2, **ALICE)
        chats = h.model.chat_requests()
        # The tool result went back to the model, then the answer; then the next turn.
        assert "<memory_context>" not in system_of(h, chats[0])
        last = system_of(h, chats[-1])
        assert "<memory_context>" in last and "Alice 喜欢喝乌龙茶" in last
        assert "(confidence 0.95)" in last
        # Provenance: agent_proactive, from this chat and message.
        row = await h.app.db.fetchone("SELECT source, user_id, chat_id, message_id FROM facts")
        assert (row["source"], row["user_id"], row["chat_id"]) == ("agent_proactive", "ou_alice", "oc_p2p_alice")
        assert row["message_id"].startswith("om_")


async def test_rule_appears_on_every_later_turn(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("procedure_write", {"rule": "Always reply in English", "context": "user asked"}),
            Text("Sure, English from now on."),
        )
        await _turn(h, "以后都用英文回复我", 1, **ALICE)
        for i in range(3):
            await _turn(h, f"question {i}", 2 + i, **ALICE)
        later = h.model.chat_requests()[2:]
        assert len(later) == 3
        for req in later:
            assert "<behavioral_guidelines>\n- Always reply in English\n</behavioral_guidelines>" in system_of(h, req)


async def test_profile_update_appears_in_user_profile(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("profile_update", {"section": "目标与方向", "entry": "2026 年底前完成独立产品上线",
                                       "mode": "append"}),
            Text("好的，我记下了你的目标。"),
        )
        await _turn(h, "我的目标是 2026 年底前完成独立产品上线", 1, **ALICE)
        await _turn(h, "帮我规划一下这个季度的工作安排吧", 2, **ALICE)
        last = system_of(h, h.model.chat_requests()[-1])
        assert "<user_profile>" in last
        section = last.split("<user_profile>")[1].split("</user_profile>")[0]
        assert "目标与方向" in section and "2026 年底前完成独立产品上线" in section


async def test_user_b_never_sees_user_a(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("memory_write", {"content": "Alice's secret project is Falcon", "category": "knowledge"}),
            Text("Noted."),
            ToolUse("procedure_write", {"rule": "Call me Captain", "context": ""}),
            Text("Aye."),
            ToolUse("profile_update", {"section": "身份与背景", "entry": "Alice works at Acme", "mode": "append"}),
            Text("Noted."),
        )
        await _turn(h, "remember my secret project is Falcon", 1, **ALICE)
        await _turn(h, "always call me Captain", 2, **ALICE)
        await _turn(h, "I work at Acme as a backend engineer", 3, **ALICE)
        await _turn(h, "what do you know about me and my projects so far?", 4, **BOB)
        # Bob in a group with Alice, too.
        await _turn(h, "what do you know about Alice's projects and her job?", 5,
                    chat_id="oc_group_1", chat_type="group", sender="ou_bob")
        for req in h.model.chat_requests()[-2:]:
            text = system_of(h, req) + " ".join(h.model.user_texts(req))
            for leaked in ("Falcon", "Captain", "Acme"):
                assert leaked not in text.replace("what do you know about Alice's projects", "")


async def test_bad_tool_arguments_get_is_error_and_an_answer(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("memory_write", {"content": "x", "category": "gossip"}),
            ToolUse("profile_update", {"section": "星座", "entry": "天秤座"}),
            Text("Done, with corrections."),
        )
        await _turn(h, "remember I am a Libra", 1, **ALICE)
        chats = h.model.chat_requests()
        results = [b for m in chats[-1].json["messages"] if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        assert len(results) == 2 and all(r.get("is_error") for r in results)
        assert "category" in str(results[0]["content"])
        assert "基础特征" in str(results[1]["content"])   # the valid sections are listed
        assert h.lark.messages()[0].text == "Done, with corrections."
        assert (await h.app.db.fetchone("SELECT COUNT(*) AS n FROM facts"))["n"] == 0


@pytest.mark.parametrize("failure", [
    Error.rate_limit(retry_after=30),      # retry-after beyond the deadline
    Error.spend_limit(),
    Error.overloaded(),
    Error.api_error(500),
    Stall(after_text="half an ans", seconds=30),
])
async def test_each_failure_ends_in_one_apology_and_the_next_message_works(tmp_path, failure):
    async with Harness(tmp_path, ethan_reply_deadline=3) as h:
        h.model.script(failure, Text("back to normal"))
        t0 = time.monotonic()
        await h.send_text("你好，帮我看看这个问题", **ALICE)
        [apology] = await h.replies(1, timeout=10)
        assert time.monotonic() - t0 < 6
        assert apology.text.startswith("抱歉")
        await h.idle()
        # The user's message is stored; no partial assistant message is.
        rows = await h.app.db.fetchall("SELECT role, content FROM messages ORDER BY id")
        assert [(r["role"], r["content"]) for r in rows] == [("user", "你好，帮我看看这个问题")]
        await h.send_text("再试一次", **ALICE)
        await h.replies(2, timeout=10)
        assert h.lark.messages()[-1].text == "back to normal"
        if failure is not None and getattr(failure, "type", "") == "rate_limit_error":
            # A spend-limit 429 is never retried; a plain one is retried only within the deadline.
            assert len(h.model.chat_requests()) == 2


async def test_rate_limit_retry_after_within_the_deadline_succeeds(tmp_path):
    async with Harness(tmp_path, ethan_reply_deadline=10) as h:
        h.model.script(Error.rate_limit(retry_after=1), Text("after waiting"))
        await h.send_text("hello there", **ALICE)
        [reply] = await h.replies(1, timeout=10)
        assert reply.text == "after waiting"
        assert len(h.model.chat_requests()) == 2


async def test_long_answer_streams_into_one_card(tmp_path):
    answer = "".join(f"第 {i} 段：这是一个很长的回答，用来测试流式卡片。\n" for i in range(80))
    async with Harness(tmp_path) as h:
        h.model.script(Text(answer))
        await h.send_text("写一篇长文", **ALICE)
        await h.idle()
        await asyncio.sleep(0.3)
        msgs = h.lark.messages()
        assert len(msgs) == 1 and msgs[0].card_id, msgs
        assert h.lark.card_text(msgs[0].card_id).strip() == answer.strip()
        card = h.lark.card(msgs[0].card_id)
        assert card.streaming_mode is False


async def test_card_failure_falls_back_to_text(tmp_path):
    answer = "long answer line\n" * 100
    async with Harness(tmp_path) as h:
        h.lark.fail_next("/cardkit/v1/cards", times=10, status=400, code=200001, msg="card error")
        h.model.script(Text(answer))
        await h.send_text("write a lot", **ALICE)
        await h.idle()
        await asyncio.sleep(0.3)
        msgs = h.lark.messages()
        assert len(msgs) == 1 and not msgs[0].card_id
        assert msgs[0].text.strip() == answer.strip()


async def test_stable_prefix_is_byte_identical_across_turns(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            Text("hi"),
            ToolUse("memory_write", {"content": "Alice likes tea", "category": "preference"}),
            Text("ok"),
            Text("sure"),
        )
        await _turn(h, "hello", 1, **ALICE)
        await _turn(h, "remember I like tea", 2, **ALICE)
        await _turn(h, "what's a good plan for the weekend trip to the mountains?", 3, **ALICE)
        systems = [req.json["system"] for req in h.model.chat_requests()]
        assert len({s[-1]["text"] for s in systems}) > 1   # the memory part did change
        assert all("Today is" not in b["text"] for s in systems for b in s)
        if h.provider == "anthropic":
            first_blocks = [s[0] for s in systems]
            assert all(b == first_blocks[0] for b in first_blocks)
            # once memory is there, the end of the system prompt is a breakpoint (prompt.py, B)
            assert systems[-1][-1]["cache_control"] == {"type": "ephemeral"}
        else:
            # one system message, the stable part first (the provider caches prefixes by
            # itself), no cache markers on the wire
            stable = build_system(MemoryBlocks())[0]["text"]
            wire = [r.wire["messages"][0] for r in h.model.chat_requests()]
            assert all(m["role"] == "system" and m["content"].startswith(stable) for m in wire)
            assert "cache" not in json.dumps([r.wire for r in h.model.chat_requests()])


async def test_memory_write_correction_supersedes_the_fact_it_corrects(tmp_path):
    # issue 19: "其实我不在杭州，我在上海" left both 用户在杭州工作 and 用户在上海 active
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("memory_write", {"content": "用户在杭州工作", "category": "knowledge"}),
            Text("记住了。"),
            ToolUse("memory_write", {"content": "用户其实不在杭州，在上海工作", "category": "correction"}),
            Text("好的，已更正。"),
            Text("你在上海工作。"),
        )
        await _turn(h, "记住：我在杭州工作", 1, **ALICE)
        await _turn(h, "其实我不在杭州，我在上海", 2, **ALICE)
        await _turn(h, "我在哪里工作？", 3, **ALICE)
        last = system_of(h, h.model.chat_requests()[-1])
        memory = last.split("<memory_context>")[1].split("</memory_context>")[0]
        assert "上海" in memory and "用户在杭州工作" not in memory
        rows = await h.app.db.fetchall("SELECT id, content, superseded_at, superseded_by FROM facts ORDER BY id")
        old, new = rows
        assert old["superseded_at"] is not None and old["superseded_by"] == new["id"]   # history kept
        assert new["superseded_at"] is None



async def test_deleting_the_session_where_she_said_remember_removes_what_the_tools_wrote(tmp_path):
    # issue 19: memory_write facts record their session (fact_sources), profile_update entries
    # theirs (profile_sources), so deleting that session takes them; what another session also
    # taught stays, and whoever deleted it is told how much went.
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("memory_write", {"content": "Alice 喜欢喝乌龙茶", "category": "preference"}),
            ToolUse("profile_update", {"section": "目标与方向", "entry": "学会做乌龙茶"}),
            ToolUse("profile_update", {"section": "身份与背景", "entry": "住在杭州"}),
            Text("记住了。"),
            ToolUse("profile_update", {"section": "身份与背景", "entry": "住在杭州"}),
            Text("好的。"),
        )
        await _turn(h, "记住：我喜欢喝乌龙茶，想学会做乌龙茶，我住在杭州", 1, **ALICE)
        first = (await h.app.db.fetchone("SELECT session_id FROM messages WHERE role = 'user'"))["session_id"]
        await _turn(h, "/new", 2, **ALICE)
        await _turn(h, "我还住在杭州", 3, **ALICE)
        assert [r["content"] for r in await h.app.db.fetchall("SELECT content FROM facts")] == ["Alice 喜欢喝乌龙茶"]
        async with h.http.delete(f"{h.url}/api/sessions/{first}") as resp:
            assert resp.status == 200
            body = await resp.json()
        removed = body["removed"]
        assert (removed["facts"], removed["profile_entries"]) == (1, 1), removed
        assert await h.app.db.fetchall("SELECT id FROM facts") == []
        left = await h.app.db.fetchall("SELECT entry FROM profile_entries")
        assert [r["entry"] for r in left] == ["住在杭州"]
