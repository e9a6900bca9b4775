"""The built-in offline model, driven by the real ``anthropic`` SDK (and the real Consolidator)."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.llm.anthropic_model import AnthropicChatModel
from bot.offline.server import setup_offline_model
from bot.tools import TOOL_SPECS
from memory.working.consolidator import Consolidator
from memory.working.view import Message, Turn

SYSTEM = [
    {"type": "text", "text": "You are Ethan.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": (
        "<behavioral_guidelines>\n- Always answer briefly\n</behavioral_guidelines>\n\n"
        "<user_profile>\n## 基础特征\n- 名字：林一\n</user_profile>\n\n"
        "<memory_context>\n- [preference] 用户喜欢喝咖啡 (confidence 0.95)\n"
        "- [knowledge] 用户在 &lt;Acme&gt; 工作 (confidence 0.80)\n</memory_context>")},
]


@pytest.fixture
async def client():
    app = web.Application()
    setup_offline_model(app, "/_offline")
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    c = anthropic.AsyncAnthropic(api_key="offline", base_url=str(server.make_url("/_offline")), max_retries=0)
    c.raw_url = str(server.make_url("/_offline/v1/messages"))   # for bodies the SDK would not send
    try:
        yield c
    finally:
        await c.close()
        await server.close()


async def post_raw(client, data: bytes) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(client.raw_url, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json()


def _user(text):
    return [{"role": "user", "content": text}]


async def test_answer_shows_what_memory_gave_it(client):
    msg = await client.messages.create(model="claude-sonnet-4-6", max_tokens=500, system=SYSTEM,
                                       messages=_user("今天喝点什么？"), tools=TOOL_SPECS)
    assert msg.stop_reason == "end_turn"
    text = msg.content[0].text
    assert text.startswith("[offline] ")
    assert "今天喝点什么？" in text                      # echoes the question
    assert "用户喜欢喝咖啡" in text and "用户在 <Acme> 工作" in text   # top facts, unescaped
    assert "Always answer briefly" in text              # the rules
    assert "林一" in text                               # the name from the profile


async def test_answer_without_memory_and_in_english(client):
    msg = await client.messages.create(model="m", max_tokens=100, messages=_user("What's new?"))
    text = msg.content[0].text
    assert text.startswith("[offline] ") and "What's new?" in text
    assert "don't remember anything" in text


async def test_streaming_gives_the_same_answer_with_the_sdk_event_sequence(client):
    kwargs = dict(model="claude-sonnet-4-6", max_tokens=500, system=SYSTEM, messages=_user("hello there, what do you know?"))
    plain = await client.messages.create(**kwargs)
    events, chunks = [], []
    async with client.messages.stream(**kwargs) as stream:
        async for ev in stream:
            events.append(ev.type)
            if ev.type == "text":
                chunks.append(ev.text)
        final = await stream.get_final_message()
    assert "".join(chunks) == plain.content[0].text == final.content[0].text
    assert len(chunks) > 1                                   # really streamed in pieces
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    raw = [e for e in events if e != "text"]
    assert raw[0] == "message_start" and raw[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(raw)


@pytest.mark.parametrize("text, tool, args", [
    ("记住我喜欢喝乌龙茶", "memory_write", {"content": "用户喜欢喝乌龙茶", "category": "preference"}),
    ("记一下：我决定下个月搬去杭州", "memory_write", {"content": "用户决定下个月搬去杭州", "category": "decision"}),
    ("记住，其实我不在北京工作了", "memory_write", {"category": "correction"}),
    ("remember that I work at Acme", "memory_write", {"content": "The user works at Acme", "category": "knowledge"}),
    ("Remember I prefer short answers", "memory_write", {"category": "preference"}),
    ("以后回答都用中文", "procedure_write", {"rule": "以后回答都用中文"}),
    ("from now on, always answer in English", "procedure_write", {}),
    ("我叫林一", "profile_update", {"section": "基础特征", "entry": "名字：林一", "mode": "merge"}),
    ("my name is Alice", "profile_update", {"section": "基础特征", "entry": "Name: Alice"}),
    # issue 52: the name ends where the name ends ("Name: Alice and" was the demo's first profile line)
    ("我叫王磊，在支付组", "profile_update", {"entry": "名字：王磊"}),
    ("我叫王磊在支付组工作", "profile_update", {"entry": "名字：王磊"}),
    ("My name is Alice and I work on the payments team.", "profile_update", {"entry": "Name: Alice"}),
    ("My name is Alice Smith, from payments", "profile_update", {"entry": "Name: Alice Smith"}),
    ("I'm Bob, I work on search", "profile_update", {"entry": "Name: Bob"}),
    ("Hi, I am Carol and I like tea", "profile_update", {"entry": "Name: Carol"}),
])
async def test_memory_tool_calls(client, text, tool, args):
    msg = await client.messages.create(model="m", max_tokens=100, messages=_user(text), tools=TOOL_SPECS)
    assert msg.stop_reason == "tool_use"
    [use] = msg.content
    assert use.type == "tool_use" and use.name == tool
    for k, v in args.items():
        assert use.input[k] == v, use.input


@pytest.mark.parametrize("text", ["I'm Happy to help", "I'm going home now", "I am tired today"])
async def test_a_capitalised_word_after_im_is_not_taken_for_a_name(client, text):
    msg = await client.messages.create(model="m", max_tokens=100, messages=_user(text), tools=TOOL_SPECS)
    assert msg.stop_reason == "end_turn", msg.content


async def test_no_tool_call_without_tools_or_for_plain_chat(client):
    msg = await client.messages.create(model="m", max_tokens=100, messages=_user("记住我喜欢喝乌龙茶"))
    assert msg.stop_reason == "end_turn" and msg.content[0].type == "text"
    for text in ("I never eat after 8pm", "我以后想当医生", "你好"):
        msg = await client.messages.create(model="m", max_tokens=100, messages=_user(text), tools=TOOL_SPECS)
        assert msg.stop_reason == "end_turn", text


async def test_tool_round_trip_streamed_then_confirmed(client):
    messages = _user("记住我喜欢喝乌龙茶")
    async with client.messages.stream(model="m", max_tokens=100, messages=messages, tools=TOOL_SPECS) as s:
        first = await s.get_final_message()
    assert first.stop_reason == "tool_use"
    [use] = first.content
    assert use.input == {"content": "用户喜欢喝乌龙茶", "category": "preference"}   # input_json_delta parsed
    messages = messages + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "added: fact #1"}]},
    ]
    async with client.messages.stream(model="m", max_tokens=100, messages=messages, tools=TOOL_SPECS) as s:
        second = await s.get_final_message()
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "[offline] 好的，我记住了：用户喜欢喝乌龙茶"
    # a failed tool is reported, not retried
    messages[-1] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "is_error": True,
                                                  "content": [{"type": "text", "text": "refused: looks like a password"}]}]}
    third = await client.messages.create(model="m", max_tokens=100, messages=messages, tools=TOOL_SPECS)
    assert third.stop_reason == "end_turn" and "没能保存" in third.content[0].text and "password" in third.content[0].text


async def test_deterministic(client):
    kwargs = dict(model="m", max_tokens=100, system=SYSTEM, messages=_user("记住我喜欢猫"), tools=TOOL_SPECS)
    a, b = await client.messages.create(**kwargs), await client.messages.create(**kwargs)
    assert a.model_dump() == b.model_dump()


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": "hello"},
    {"messages": [{"role": "user", "content": 42}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"messages": [{"role": "user", "content": [None, "x", {"type": "text", "text": None}]}]},
    {"system": {"type": "text", "text": "x"}, "messages": [{"role": "user", "content": "hi"}]},
    {"system": 5, "messages": [{"role": "assistant", "content": "dangling"}]},
    {"tool_choice": {"type": "tool", "name": "write_summary"}, "messages": None},
    {"output_config": {"format": {"type": "json_schema", "schema": None}}, "messages": [{"role": "user"}]},
    {"tools": "x", "messages": [{"role": "user", "content": "记住 x"}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]},
    {"tools": [{"name": ["unhashable"]}], "messages": [{"role": "user", "content": "记住 x"}]},
])
async def test_odd_input_gets_a_short_text_never_a_crash(client, body):
    status, data = await post_raw(client, json.dumps({"model": "m", "max_tokens": 10, **body}).encode())
    assert status == 200, data
    assert data["type"] == "message" and data["content"], data
    block = data["content"][0]
    if "output_config" in body:
        assert json.loads(block["text"])        # structured output: JSON text
    else:
        assert (block["type"] == "text" and block["text"].startswith("[offline] ")) or block["type"] == "tool_use"


async def test_a_body_that_is_not_json_is_a_400(client):
    status, data = await post_raw(client, b"{not json")
    assert status == 400 and data["error"]["type"] == "invalid_request_error"
    status, data = await post_raw(client, b"[1, 2]")
    assert status == 400


# -- consolidation, through the real Consolidator in each of its three request shapes ---------

def _turns():
    def t(i, user, answer, name="林一"):
        return Turn(user=Message(i, "user", user, "ou_a", name), assistant=[Message(i + 1, "assistant", answer)])
    return [t(1, "我是一名后端工程师。我在杭州工作，每天写 Go。", "[offline] 好的\n我记得：助手自己说的话"),
            t(3, "记住我喜欢喝咖啡", "[offline] 好的，我记住了"),
            t(5, "最近压力很大，睡不好。", "[offline] 抱抱你")]


@pytest.mark.parametrize("model, mode", [("claude-haiku-4-5", "tool"), ("claude-opus-4-7", "structured"),
                                         ("claude-haiku-4-5", "json")])
async def test_consolidator_summary_and_extraction(client, model, mode):
    chat = AnthropicChatModel(client, model)
    c = Consolidator(chat)
    if mode == "json":
        chat.modes._learned[model] = "json"          # what a 400 rejecting output_config teaches it
    assert chat.modes.mode_for(model) == mode
    summary = await c.compress(_turns())
    assert "我是一名后端工程师" in summary and "我喜欢喝咖啡" in summary
    assert "[offline]" not in summary and "助手自己说的话" not in summary     # what users said, only
    assert len(summary) <= 600

    got = await c.extract([t.user_text for t in _turns()], companion=True)
    contents = {f.content: (f.category, f.importance) for f in got.facts}
    assert contents["用户是一名后端工程师"] == ("knowledge", 0.8)
    assert contents["用户在杭州工作"][0] == "knowledge"
    assert contents["用户喜欢喝咖啡"] == ("preference", 0.95)      # 记住 → strong signal
    assert got.profile_psych and "压力很大" in got.profile_psych[0]

    work = await c.extract([t.user_text for t in _turns()], companion=False)
    assert work.facts and not work.profile_psych


async def test_consolidator_fold_and_episode(client):
    c = Consolidator(AnthropicChatModel(client, "claude-haiku-4-5"))
    folded = await c.fold("用户是后端工程师。", ["用户喜欢咖啡。", "用户最近压力大。"])
    assert "后端工程师" in folded and "咖啡" in folded and "压力" in folded
    episode = await c.summarize_episode("", _turns())
    assert "后端工程师" in episode


async def test_count_tokens(client):
    n = await client.messages.count_tokens(model="m", messages=_user("hello " * 100))
    assert n.input_tokens > 50
    assert json.loads(n.model_dump_json())["input_tokens"] == n.input_tokens


@pytest.mark.parametrize("text", ["我叫什么名字？", "我叫什么名字", "你记住了吗？", "你还记得我喜欢喝什么吗",
                                  "What is my name?", "do you remember my name"])
async def test_a_question_never_writes_memory(client, text):
    # issue 19: "我叫什么名字？" overwrote the profile name with 名字：什么名字; "你记住了吗？"
    # stored the fact "了吗？"
    msg = await client.messages.create(model="m", max_tokens=100, messages=_user(text), tools=TOOL_SPECS)
    assert msg.stop_reason == "end_turn" and msg.content[0].type == "text", msg.content
    c = Consolidator(AnthropicChatModel(client, "ethan-offline"))
    assert (await c.extract([text], companion=False)).facts == []


async def test_summaries_of_summaries_do_not_repeat(client):
    c = Consolidator(AnthropicChatModel(client, "ethan-offline"))
    first = await c.compress(_turns())
    second = await c.compress(_turns(), previous_summary=first)     # the same turns again
    assert second.count("我是一名后端工程师") == 1
    folded = await c.fold(first, [first, second])
    for sentence in ("我是一名后端工程师", "我喜欢喝咖啡"):
        assert folded.count(sentence) <= 1, folded


async def test_extraction_decides_against_the_existing_facts(client):
    # the extraction contract (issue 19): per fact add / reinforce / update(id) / contradict(id)
    c = Consolidator(AnthropicChatModel(client, "ethan-offline"))
    existing = [(7, "用户在杭州工作"), (9, "用户喜欢喝乌龙茶")]
    got = await c.extract(["其实我不在杭州，我在上海工作", "我喜欢喝乌龙茶", "我养了一只猫"], companion=False,
                          existing=existing)
    by = {f.content: (f.action, f.target_id) for f in got.facts}
    assert by["用户喜欢喝乌龙茶"] == ("reinforce", 9)
    assert any(v == ("update", 7) for k, v in by.items() if "上海" in k), by
    assert by["用户养了一只猫"] == ("add", None)
    # a target it was not shown is no decision
    assert all(f.target_id in (None, 7, 9) for f in got.facts)
