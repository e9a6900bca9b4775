"""The memory layers end to end, through signed webhook events and the fake model."""

from __future__ import annotations

import pytest

from tests.fakes.fake_anthropic import Text, ToolUse, default_responder, is_chat
from tests.harness import Harness

# Every test here runs on each model adapter (Anthropic, OpenAI-compatible): same assertions.
pytestmark = [pytest.mark.usefixtures("model_provider"), pytest.mark.app_backends]

ALICE = dict(chat_id="oc_p2p_alice", sender="ou_alice")


async def _say(h, text, **who):
    n = len(h.lark.messages()) + 1
    await h.send_text(text, **who)
    await h.replies(n)
    await h.idle()


async def test_restart_keeps_the_conversation_and_its_history(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
        await _say(h, "我在做一个叫 Falcon 的项目", **ALICE)
        await _say(h, "它用 Go 写的", **ALICE)
        await h.restart()
        await _say(h, "刚才说的项目叫什么？", **ALICE)
        texts = h.model.user_texts(h.model.chat_requests()[-1])
        assert any("Falcon" in t for t in texts[:-1])   # replayed from before the restart
        rows = await h.app.db.fetchall("SELECT id FROM sessions")
        assert len(rows) == 1                            # same session continues


def _context_blocks(req) -> str:
    """The text in front of the user's words in the last user message (volatile context)."""
    content = req.json["messages"][-1]["content"]
    if isinstance(content, str):
        return ""
    return "\n".join(b.get("text", "") for b in content[:-1] if b.get("type") == "text")


def _summary(req):
    return {"summary": "讨论了 Falcon 项目从 Python 迁移到 Go 的计划和风险"}


async def test_new_writes_an_episode_that_a_later_session_recalls(tmp_path):
    async with Harness(tmp_path) as h:
        # Chat turns answer "好的"; background extraction gets the fake's default answer.
        h.model.responder = lambda req: Text("好的") if is_chat(req) else default_responder(req)
        h.model.on_tool("write_summary", _summary, keys={"summary"})
        for text in ("Falcon 项目准备从 Python 迁移到 Go", "主要风险是团队不熟悉 Go", "迁移计划分三个阶段"):
            await _say(h, text, **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        rows = await h.app.db.fetchall("SELECT user_id, summary, keywords, turn_count FROM episodes")
        assert len(rows) == 1
        ep = rows[0]
        assert ep["user_id"] == "ou_alice" and ep["turn_count"] == 3 and "Falcon" in ep["summary"]
        assert ep["keywords"] != "[]"
        # A one-turn session writes none.
        await _say(h, "随便问一句", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        assert len(await h.app.db.fetchall("SELECT id FROM episodes")) == 1
        # A later message on the same topic brings it back; Bob never sees it.
        await _say(h, "上次我们聊的 Falcon 项目迁移到 Go 的风险，你还记得吗？", **ALICE)
        # recalled episodes change with every message: they ride in front of the user's words,
        # after the cached prefix (DESIGN §3), fenced as in the system prompt
        req = h.model.chat_requests()[-1]
        context = _context_blocks(req)
        assert "<related_episodes>" in context and "Falcon" in context
        assert "<related_episodes>" not in h.model.last_system_text(req)
        await _say(h, "上次我们聊的 Falcon 项目迁移到 Go 的风险，你还记得吗？",
                   chat_id="oc_p2p_bob", sender="ou_bob")
        req = h.model.chat_requests()[-1]
        assert "<related_episodes>" not in _context_blocks(req) + h.model.last_system_text(req)


async def test_group_requests_never_carry_the_psychology_section(tmp_path):
    async with Harness(tmp_path) as h:
        h.model.script(
            ToolUse("profile_update", {"section": "心理与情绪", "entry": "最近因为项目延期压力很大"}),
            Text("我在。"),
        )
        await _say(h, "最近项目延期，我压力很大", **ALICE)
        h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
        # The group-learned entry is shared; the p2p one and the psychology section are not.
        h.model.script(ToolUse("profile_update", {"section": "身份与背景", "entry": "负责支付系统"}), Text("ok"))
        await _say(h, "我负责支付系统，帮我们梳理一下这周的发布计划吧", chat_id="oc_group_9",
                   chat_type="group", sender="ou_alice")
        await _say(h, "帮我们梳理一下这周的发布计划和每个人负责的部分", chat_id="oc_group_9",
                   chat_type="group", sender="ou_alice")
        group_system = h.model.last_system_text(h.model.chat_requests()[-1])
        assert "心理与情绪" not in group_system and "压力" not in group_system
        assert "负责支付系统" in group_system
        await _say(h, "帮我回顾一下最近的工作状态和压力来源吧，顺便给点建议", **ALICE)
        p2p_system = h.model.last_system_text(h.model.chat_requests()[-1])
        assert "心理与情绪" in p2p_system and "压力很大" in p2p_system


async def test_a_short_question_without_a_cue_gets_what_was_said_in_that_session(tmp_path):
    # issue 19: "When did Jon lose his job?" never reached the episode lookup (no cue word,
    # under 40 characters), and a detail said mid-session was not in the summary
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
        h.model.on_tool("write_summary", lambda req: {"summary": "The user is training for the Berlin marathon."},
                        keys={"summary"})
        for text in ("I'm training for the Berlin marathon.", "Work was busy again today.",
                     "My physio says the shin splints come from tight calves."):
            await _say(h, text, **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        await _say(h, "what did my physio say?", **ALICE)          # 24 characters, no cue
        req = h.model.chat_requests()[-1]
        context = _context_blocks(req)
        assert "<related_episodes>" in context and "tight calves" in context, context
        assert "Berlin marathon" in context                         # the summary beside the excerpt
        await _say(h, "how do I make pancakes?", **ALICE)           # unrelated: nothing injected
        assert "<related_episodes>" not in _context_blocks(h.model.chat_requests()[-1])


async def test_extraction_decides_against_the_existing_facts_and_the_store_applies_it(tmp_path):
    # issue 19: extraction sees the user's most similar facts (ids + text) and returns per
    # fact add / reinforce / update(id) / contradict(id); superseded facts keep their history
    from tests.fakes.fake_anthropic import existing_facts

    seen: list[list] = []

    def extract(req):
        known = existing_facts(req)
        seen.append(known)
        said = " ".join(h_texts(req))
        if "上海" in said:
            target = next(i for i, t in known if "杭州" in t)
            return {"facts": [{"content": "用户在上海工作", "category": "correction", "importance": 0.9,
                               "action": "update", "target_id": target}], "profile_psych": []}
        if "喜欢" in said:
            target = next(i for i, t in known if "乌龙茶" in t)
            return {"facts": [{"content": "用户爱喝乌龙", "category": "preference", "importance": 0.8,
                               "action": "reinforce", "target_id": target}], "profile_psych": []}
        return {"facts": [{"content": "用户在杭州工作", "category": "knowledge", "importance": 0.8,
                           "action": "add", "target_id": 0},
                          {"content": "用户喜欢乌龙茶", "category": "preference", "importance": 0.8,
                           "action": "add", "target_id": 0}], "profile_psych": []}

    def h_texts(req):
        return [b.get("text", "") for m in req["messages"] for b in
                (m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}])]

    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
        h.model.on_tool("extract_memories", extract, keys={"facts", "profile_psych"})
        await _say(h, "我在杭州工作，爱喝乌龙茶", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        await _say(h, "其实我已经在上海工作了", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        await _say(h, "我真的很喜欢乌龙茶", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        rows = await h.app.db.fetchall(
            "SELECT id, content, confidence, superseded_at, superseded_by FROM facts ORDER BY id")
        by = {r["content"]: r for r in rows}
        assert set(by) == {"用户在杭州工作", "用户喜欢乌龙茶", "用户在上海工作"}      # no duplicate
        assert by["用户在杭州工作"]["superseded_by"] == by["用户在上海工作"]["id"]
        assert by["用户在杭州工作"]["superseded_at"] is not None
        assert by["用户喜欢乌龙茶"]["confidence"] > 0.8                          # reinforced
        assert any(any("杭州" in t for _, t in known) for known in seen)        # it was shown the facts


async def test_deleting_a_session_removes_the_profile_entries_extraction_learned_only_there(tmp_path):
    # issue 19: profile entries keep which sessions taught them (profile_sources); extraction's
    # 心理与情绪 entries (companion mode) are learned from the session it read
    def extract(req):
        said = " ".join(b.get("text", "") for m in req["messages"] for b in
                        (m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]))
        psych = ["最近工作压力很大"] + (["对搬家感到焦虑"] if "搬家" in said else [])
        return {"facts": [], "profile_psych": psych}

    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("ok") if is_chat(req) else default_responder(req)
        h.model.on_tool("extract_memories", extract, keys={"facts", "profile_psych"})
        await _say(h, "/mode 陪伴", **ALICE)
        await _say(h, "我下个月要搬家，工作也很忙", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        first = (await h.app.db.fetchone(
            "SELECT session_id FROM messages WHERE content LIKE '%搬家%'"))["session_id"]
        await _say(h, "今天又加班了，压力好大", **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        entries = sorted(r["entry"] for r in await h.app.db.fetchall("SELECT entry FROM profile_entries"))
        assert entries == ["对搬家感到焦虑", "最近工作压力很大"]
        async with h.http.delete(f"{h.url}/api/sessions/{first}") as resp:
            assert resp.status == 200
            assert (await resp.json())["removed"]["profile_entries"] == 1
        entries = [r["entry"] for r in await h.app.db.fetchall("SELECT entry FROM profile_entries")]
        assert entries == ["最近工作压力很大"]          # the second session taught it too


async def test_forget_a_fact_removes_it_from_every_layer_the_next_request_reads(tmp_path):
    # issue 31: after /forget <id> the next answer still recalled the fact from an episode
    import json

    from memory.scope import Scope

    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("好的") if is_chat(req) else default_responder(req)
        h.model.on_tool("write_summary", lambda req: {
            "summary": "用户的手机号是13800138000。用户在装修新房，想选木地板。"}, keys={"summary"})
        for text in ("我在装修新房，想选木地板", "对了我的手机号是13800138000，装修公司要联系我",
                     "地板想要浅色的", "预算大概五万"):
            await _say(h, text, **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        w = await h.app.memory.facts.add(Scope("ou_alice", "oc_p2p_alice", "p2p"), "用户的手机号是13800138000",
                                         "knowledge", source="agent_proactive")
        await h.app.db.execute(
            "INSERT INTO profile_entries(user_id, section, position, entry, visibility, source, created_at, updated_at)"
            " VALUES ('ou_alice', '身份与背景', 0, '手机号 13800138000', 'private', 'consolidator', 0, 0)")
        # before: the phone number reaches the model from memory (the episode's evidence)
        await _say(h, "装修公司要我的手机号是多少来着", **ALICE)
        assert "13800138000" in json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)
        await _say(h, "/new", **ALICE)
        await _say(h, f"/forget {w.fact.id}", **ALICE)
        await _say(h, "装修公司要我的手机号是多少来着", **ALICE)
        body = json.dumps(h.model.chat_requests()[-1].json, ensure_ascii=False)
        assert "13800138000" not in body                     # no layer: facts, profile, episodes, summaries
        [ep] = await h.app.memory.episodes.recent("ou_alice", 1)
        assert "木地板" in ep.summary and "装修" in "\n".join(await h.app.memory.episodes.turns(ep.id))  # the rest stays
        for table, col in (("episodes", "summary"), ("episode_chunks", "text"), ("facts", "content"),
                           ("profile_entries", "entry"), ("warm_summaries", "summary"),
                           ("consolidation_state", "rolling_summary")):
            rows = await h.app.db.fetchall(f"SELECT {col} AS t FROM {table}")
            assert not any("13800138000" in (r["t"] or "") for r in rows), table


async def test_a_chinese_conversation_is_remembered_in_chinese(tmp_path):
    # issue 31 (mem0#3707): every consolidation request of a Chinese conversation names Chinese
    # as the language to write in, and what is stored — summaries, episode, facts — is Chinese
    import re

    cjk = re.compile(r"[\u4e00-\u9fff]")
    async with Harness(tmp_path) as h:
        h.model.responder = lambda req: Text("好的") if is_chat(req) else default_responder(req)
        # a model writes in the language it is told (the fake: Chinese only when told so)
        h.model.on_tool("write_summary", lambda req: {"summary": "用户李雷在杭州做后端开发，准备搬家到滨江。"
                                                       if "简体中文" in h.model.last_system_text(req)
                                                       else "The user works as a backend developer."},
                        keys={"summary"})
        for text in ("我叫李雷，在杭州做后端开发", "我每周三晚上去游泳", "我女儿叫小雨，今年六岁",
                     "最近在准备搬家到滨江", "记住我不吃香菜"):
            await _say(h, text, **ALICE)
        await _say(h, "/new", **ALICE)
        await h.idle()
        consolidation = [r for r in h.model.requests if r.kind in ("tool", "structured")]
        assert consolidation
        for r in consolidation:
            assert "write every summary, fact and entry in Chinese (简体中文)" in h.model.last_system_text(r), r
        [ep] = await h.app.memory.episodes.recent("ou_alice", 1)
        assert cjk.search(ep.summary), ep.summary
        facts = await h.app.db.fetchall("SELECT content FROM facts WHERE user_id = 'ou_alice'")
        assert all(cjk.search(f["content"]) for f in facts), facts
        # and an English conversation is told English
        BOB = dict(chat_id="oc_p2p_bob", sender="ou_bob")
        before = len(h.model.requests)
        for text in ("I'm Bob and I work in Berlin", "I swim every Wednesday evening", "Remember I don't eat cilantro"):
            await _say(h, text, **BOB)
        await _say(h, "/new", **BOB)
        await h.idle()
        later = [r for r in h.model.requests[before:] if r.kind in ("tool", "structured")]
        assert later and all("The conversation is in English" in h.model.last_system_text(r) for r in later)
