"""The consolidator against the fake Messages API, through the real anthropic SDK."""

from __future__ import annotations

import anthropic
import pytest

from memory.consolidator import (
    EXTRACT_TOOL, SUMMARY_TOOL, ConsolidationError, Consolidator, clean_user_line,
)
from memory.working import Message, Turn
from tests.fakes.fake_anthropic import Error, FakeAnthropic, forced_tool, is_structured, user_texts


@pytest.fixture
def fake():
    with FakeAnthropic() as f:
        yield f


@pytest.fixture
async def client(fake):
    c = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def turn(user: str, answer: str = "", name: str = "Alice", uid: str = "ou_alice", i: int = 1) -> Turn:
    t = Turn(user=Message(id=i, role="user", content=user, sender_id=uid, sender_name=name))
    if answer:
        t.assistant.append(Message(id=i + 1, role="assistant", content=answer))
    return t


async def test_compress_forced_tool_on_routed_model(fake, client):
    fake.on_tool(SUMMARY_TOOL, {"summary": "Alice plans a trip to Kyoto."})
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    assert c.model == "claude-haiku-4-5"
    out = await c.compress([turn("I'm going to Kyoto in May", "Nice!")], previous_summary="earlier")
    assert out == "Alice plans a trip to Kyoto."
    [req] = fake.requests
    assert req.model == "claude-haiku-4-5"
    assert req.json["tool_choice"] == {"type": "tool", "name": "write_summary"}
    [tool] = req.json["tools"]
    assert tool["name"] == "write_summary"
    assert set(tool["input_schema"]["properties"]) == {"summary"}
    assert req.json["temperature"] == 0.0
    text = user_texts(req.json)[0]
    assert "[Alice]: I'm going to Kyoto in May" in text and "[assistant]: Nice!" in text and "earlier" in text


async def test_override_model_wins(fake, client):
    fake.on_tool(SUMMARY_TOOL, {"summary": "s"})
    c = Consolidator(client, main_model="claude-sonnet-4-6", override_model="claude-haiku-4-5-20251001")
    await c.compress([turn("x")])
    assert fake.requests[0].model == "claude-haiku-4-5-20251001"


async def test_extract_shape_and_user_lines_only(fake, client):
    fake.on_tool(EXTRACT_TOOL, {
        "facts": [
            {"content": "The user is vegetarian", "category": "preference", "importance": 0.9},
            {"content": "The user's password is hunter2!", "category": "knowledge", "importance": 0.8},
            {"content": "odd category", "category": "gossip", "importance": 7},
        ],
        "profile_psych": [{"entry": "stressed about exams"}],
    })
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    out = await c.extract([
        "I'm vegetarian",
        "[长期记忆]\nthe user likes golf",                       # injected memory echoed back
        "see <memory_context>- likes golf</memory_context> ok",
        "my api_key=sk-ant-abcdefghijklmnopqrstuvwx",
    ], companion=False)
    assert [f.content for f in out.facts] == ["The user is vegetarian", "odd category"]
    assert out.facts[1].category == "knowledge" and out.facts[1].importance == 1.0
    assert out.skipped_secrets == 1
    assert out.profile_psych == []                                  # work mode: never kept
    [req] = fake.requests
    [tool] = req.json["tools"]
    props = tool["input_schema"]["properties"]
    assert set(props) == {"facts", "profile_psych"}
    assert set(props["facts"]["items"]["properties"]) == {"content", "category", "importance"}
    assert props["facts"]["items"]["properties"]["category"]["enum"] == [
        "preference", "decision", "knowledge", "correction"]
    assert set(props["profile_psych"]["items"]["properties"]) == {"entry"}
    sent = user_texts(req.json)[0]
    assert "vegetarian" in sent and "golf" not in sent and "memory_context" not in sent
    assert "sk-ant-" not in sent and "[redacted]" in sent
    assert "Leave profile_psych empty" in req.json["system"]


async def test_extract_companion_keeps_psych(fake, client):
    fake.on_tool(EXTRACT_TOOL, {"facts": [], "profile_psych": [{"entry": "worried about the move"}]})
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    out = await c.extract(["moving next week, I'm anxious"], companion=True)
    assert out.profile_psych == ["worried about the move"]
    assert "心理与情绪" in fake.requests[0].json["system"]


async def test_extract_nothing_to_read_makes_no_call(fake, client):
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    out = await c.extract(["[对话摘要]\nsomething", "  "], companion=True)
    assert out.facts == [] and fake.requests == []


async def test_structured_outputs_for_model_without_forced_tools(fake, client):
    fake.on_tool(SUMMARY_TOOL, {"summary": "structured summary"}, keys={"summary"})
    c = Consolidator(client, main_model="claude-opus-4-7", override_model="claude-opus-4-7")
    assert await c.compress([turn("hello")]) == "structured summary"
    [req] = fake.requests
    assert req.kind == "structured"
    assert "tools" not in req.json and "tool_choice" not in req.json
    assert "temperature" not in req.json and "top_p" not in req.json      # caps: no sampling params
    fmt = req.json["output_config"]["format"]
    assert fmt["type"] == "json_schema" and set(fmt["schema"]["properties"]) == {"summary"}


async def test_unknown_model_routes_to_itself_and_uses_structured_outputs(fake, client):
    fake.on_tool(EXTRACT_TOOL, {"facts": [{"content": "The user codes in Rust", "category": "knowledge",
                                          "importance": 0.8}], "profile_psych": []},
                 keys={"facts", "profile_psych"})
    c = Consolidator(client, main_model="acme-large-2")
    assert c.model == "acme-large-2"
    out = await c.extract(["I write Rust"], companion=False)
    assert [f.content for f in out.facts] == ["The user codes in Rust"]
    assert fake.requests[0].kind == "structured" and "temperature" not in fake.requests[0].json


async def test_forced_tool_rejected_falls_back_and_is_remembered(fake, client):
    fake.on(lambda r: forced_tool(r) is not None,
            Error.invalid_request("tool_choice: forced tool use is not supported for this model"))
    fake.on(is_structured, lambda r: __import__("tests.fakes.fake_anthropic", fromlist=["Json"]).Json(
        {"summary": "fallback ok"}))
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    assert c.mode_for() == "tool"
    assert await c.compress([turn("a")]) == "fallback ok"
    assert [r.kind for r in fake.requests] == ["tool", "structured"]
    assert c.mode_for() == "structured"
    assert await c.compress([turn("b")]) == "fallback ok"
    assert [r.kind for r in fake.requests] == ["tool", "structured", "structured"]   # learned


async def test_other_400_is_not_a_fallback(fake, client):
    fake.on(lambda r: True, Error.invalid_request("max_tokens: too large"))
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    with pytest.raises(ConsolidationError):
        await c.compress([turn("a")])
    assert len(fake.requests) == 1 and c.mode_for() == "tool"


async def test_api_errors_and_bad_shapes_raise(fake, client):
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    fake.on(lambda r: True, Error.overloaded())
    with pytest.raises(ConsolidationError):
        await c.compress([turn("a")])
    fake.clear()
    # default responder: minimal instance -> empty summary is unusable
    with pytest.raises(ConsolidationError):
        await c.compress([turn("a")])


async def test_summarize_episode(fake, client):
    fake.on_tool(SUMMARY_TOOL, {"summary": "They planned Kyoto."})
    c = Consolidator(client, main_model="claude-sonnet-4-6")
    out = await c.summarize_episode("Earlier: budget set", [turn("book the ryokan", "done")])
    assert out == "They planned Kyoto."
    sent = user_texts(fake.requests[0].json)[0]
    assert "Earlier: budget set" in sent and "book the ryokan" in sent


def test_clean_user_line():
    assert clean_user_line("[长期记忆]\nfoo") == ""
    assert clean_user_line("a <user_profile>secret stuff</user_profile> b") == "a  b"
    assert "[redacted]" in clean_user_line("password: hunter22")
