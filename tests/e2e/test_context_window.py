"""What the model sees, at the wire: no hole in the conversation whether consolidation works
or fails, and a prompt laid out so the provider's cache serves most of it (DESIGN §3, §4)."""

from __future__ import annotations

import re

import pytest

from tests.fakes.fake_anthropic import Error, Text, default_responder, is_chat, user_texts
from tests.harness import Harness

# the apps here run on SQLite and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.app_backends

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")
CODE = "the launch code word is PELICAN"


async def _say(h, text, **who):
    n = len(h.lark.messages()) + 1
    await h.send_text(text, **who)
    await h.replies(n)
    await h.idle()


def _transcript_summary(req: dict) -> dict:
    """A consolidation model that keeps what was said (as a real one keeps a code word)."""
    said = [line for t in user_texts(req) for line in t.splitlines() if line.startswith("[")]
    return {"summary": "Summary: " + " / ".join(said)[:1500]}


def _request_text(req) -> str:
    return "\n".join(user_texts(req.json)) + "\n" + "\n".join(
        b.get("text", "") for m in req.json["messages"] if m["role"] == "assistant"
        for b in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}]))


async def _conversation(h, turns: int) -> list:
    h.model.responder = lambda req: Text("ok, noted") if is_chat(req) else default_responder(req)
    await _say(h, CODE, **ALICE)
    for i in range(2, turns + 1):
        await _say(h, f"filler message number {i}, nothing to remember", **ALICE)
    return h.model.chat_requests()


async def test_turn_one_is_still_seen_at_turn_fifteen_with_consolidation_working(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.on_tool("write_summary", _transcript_summary, keys={"summary"})
        chats = await _conversation(h, 15)
        assert len(chats) == 15
        assert "PELICAN" in _request_text(chats[14])          # turn 15: still verbatim
        # ... and once turn 1 has been compressed, it is in the [对话摘要] instead
        for i in range(16, 22):
            await _say(h, f"filler message number {i}", **ALICE)
        last = h.model.chat_requests()[-1]
        summary = [t for t in user_texts(last.json) if t.startswith("[对话摘要]")]
        assert summary and "PELICAN" in summary[0]
        assert not any("PELICAN" in t for t in user_texts(last.json) if not t.startswith("[对话摘要]"))


async def test_turn_one_is_still_seen_with_every_consolidation_call_failing(tmp_path, caplog):
    async with Harness(tmp_path) as h:
        h.model.on(lambda req: not is_chat(req), Error.api_error())     # every consolidation call
        chats = await _conversation(h, 15)
        assert "PELICAN" in _request_text(chats[14])
        for i in range(16, 26):
            await _say(h, f"filler message number {i}", **ALICE)
        last = h.model.chat_requests()[-1]
        # nothing was compressed, and all 24 earlier turns are replayed verbatim (within budget)
        assert not any(t.startswith("[对话摘要]") for t in user_texts(last.json))
        assert user_texts(last.json)[0] == CODE and len(user_texts(last.json)) == 25
        assert h.model.tool_requests("write_summary") or h.model.structured_requests()


async def test_consecutive_requests_are_served_from_the_prompt_cache(tmp_path):
    """From the third turn on, every request reads from the cache everything up to the previous
    turn (tools, persona, memory, replayed turns) and pays full price only for the new turn.
    (The first request replays nothing, and tools + persona alone are under Sonnet's 1,024-token
    minimum: nothing to cache until the second request writes its replayed turn.)"""
    async with Harness(tmp_path) as h:
        h.model.on_tool("write_summary", _transcript_summary, keys={"summary"})
        h.model.responder = lambda req: Text("ok, noted: " + "x" * 200) if is_chat(req) else default_responder(req)
        for i in range(1, 9):
            await _say(h, f"question number {i}: " + "tell me something about caching " * 8, **ALICE)
        chats = h.model.chat_requests()
        assert chats[1].usage["cache_creation_input_tokens"] > 0
        for prev, req in zip(chats[1:], chats[2:]):
            wire = req.json
            marks = [b for b in wire["system"] if "cache_control" in b] + [
                b for m in wire["messages"] if isinstance(m["content"], list) for b in m["content"]
                if "cache_control" in b]
            assert 1 <= len(marks) <= 4
            # the last breakpoint is on the last replayed turn, right before the current input
            last_stable = wire["messages"][-2]
            assert last_stable["role"] == "assistant" and "cache_control" in last_stable["content"][-1]
            assert "cache_control" not in str(wire["messages"][-1])
            u = req.usage
            assert u["cache_read_input_tokens"] > 0, u
            assert u["cache_read_input_tokens"] >= prev.input_tokens - prev.usage["input_tokens"] - 1
            assert u["input_tokens"] < 0.2 * req.input_tokens, u
        # the date travels with the current input, after every cached part
        assert re.search(r"Today is \d{4}-\d\d-\d\d\.", chats[-1].json["messages"][-1]["content"][0]["text"])
        assert "Today is" not in h.model.last_system_text(chats[-1])


async def test_console_panel_reports_cached_written_and_uncached_input_per_answer(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("sure: " + "y" * 300) if is_chat(req) else default_responder(req)
        bodies = []
        for i in range(4):
            async with h.http.post(h.url + "/api/playground", json={
                    "user_id": "ou_alice", "name": "Alice", "chat": "p2p", "mention": True,
                    "text": f"playground question {i}: " + "explain prompt caching please " * 10}) as r:
                assert r.status == 200
                bodies.append(await r.json())
        chats = h.model.chat_requests()
        for body, req in zip(bodies, chats):
            tokens = body["memory"]["tokens"]
            # exactly what the model API reported for this answer
            assert tokens == {"cached": req.usage["cache_read_input_tokens"],
                              "written": req.usage["cache_creation_input_tokens"],
                              "uncached": req.usage["input_tokens"], "output": req.usage["output_tokens"]}
        assert bodies[-1]["memory"]["tokens"]["cached"] > bodies[-1]["memory"]["tokens"]["uncached"] > 0


async def test_injected_facts_keep_their_order_while_last_accessed_reorders_the_ranking(tmp_path):
    """20 facts of equal confidence: the top 15 are chosen by last_accessed, and injecting them
    touches it — which used to reorder the lines between two turns and change the cached prefix."""
    from memory.scope import Scope

    async with Harness(tmp_path) as h:
        scope = Scope(user_id="ou_alice", chat_id="oc_p2p_alice", chat_type="p2p")
        # (not imported from bench/: importing bench.common quiets the "ethan" loggers process-wide)
        facts = ["在上海工作", "是后端工程师", "用 PostgreSQL", "每周三下午有组会", "女儿下个月过生日",
                 "喜欢先听结论", "季度预算还剩三十万", "下周去深圳出差", "负责招聘", "喜欢喝咖啡",
                 "偏好 Python 示例", "正在学习 Rust", "计划考 AWS 认证", "早上效率最高", "设计评审在周四",
                 "用飞书沟通", "不喜欢冗长的回答", "养了一只猫", "周末爬山", "开一辆电动车"]
        for content in facts:
            await h.app.memory.facts.add(scope, "用户" + content, "knowledge", source="consolidator",
                                         importance=0.8)
        assert len(await h.app.memory.facts.top(scope, k=50)) == 20
        # learned at different times (the oldest first); the top 15 are the most recently accessed
        await h.app.db.execute("UPDATE facts SET last_accessed = 1000 + id")
        h.model.responder = lambda req: Text("noted") if is_chat(req) else default_responder(req)
        for i in range(3):
            await _say(h, f"an ordinary question number {i}", **ALICE)
        systems = [r.json["system"] for r in h.model.chat_requests()]
        memory_blocks = [s[-1]["text"] for s in systems]
        assert memory_blocks[0].count("\n- [") == 15                 # top 15 of 20 injected
        assert memory_blocks[0] == memory_blocks[1] == memory_blocks[2]
