"""The fakes are only useful if the real SDKs cannot tell them from the real services.

Every test here drives a fake with the real client: ``anthropic.AsyncAnthropic`` for
FakeAnthropic, ``lark_oapi.Client`` (and lark-oapi's own webhook dispatcher) for FakeLark and the
event builders. Each test is fast (well under a second).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import anthropic
import httpx2
import lark_oapi as lark
import pytest
import requests
from lark_oapi.api.cardkit.v1 import (
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
)
from lark_oapi.api.contact.v3 import BatchUserRequest, GetUserRequest
from lark_oapi.api.im.v1 import (
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageReactionRequest,
    Emoji,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
    UpdateMessageRequest,
    UpdateMessageRequestBody,
)
from lark_oapi.core.model import RawRequest
from lark_oapi.core.utils.decryptor import AESCipher

from tests.fakes import (
    Delay,
    Error,
    FakeAnthropic,
    FakeLark,
    Stall,
    Text,
    ToolUse,
    Turn,
    chat_rate_limited,
    decrypt,
    encrypt,
    load_fixture,
    make_text_event,
    rate_limited,
    server_error,
    sign,
    url_verification,
    webhook_request,
)
from tests.fakes.fake_anthropic import estimate_tokens, system_text

MODEL = "claude-sonnet-4-6"
USER = [{"role": "user", "content": "hello"}]


# ------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------


@pytest.fixture
def fake_llm():
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
async def llm(fake_llm):
    client = anthropic.AsyncAnthropic(base_url=fake_llm.base_url, api_key="test", max_retries=0, timeout=5)
    async with client:
        yield client


@pytest.fixture
def fake_lark():
    with FakeLark() as fake:
        yield fake
        assert not fake.internal_errors, fake.internal_errors


@pytest.fixture
def client(fake_lark):
    return (lark.Client.builder().app_id("cli_test").app_secret("secret")
            .domain(fake_lark.base_url).log_level(lark.LogLevel.ERROR).build())


def reply_req(message_id: str, text: str, *, uuid: str | None = None, msg_type: str = "text",
              content: str | None = None, in_thread: bool | None = None) -> ReplyMessageRequest:
    body = ReplyMessageRequestBody.builder().msg_type(msg_type).content(
        content if content is not None else json.dumps({"text": text}, ensure_ascii=False))
    if uuid:
        body = body.uuid(uuid)
    if in_thread is not None:
        body = body.reply_in_thread(in_thread)
    return ReplyMessageRequest.builder().message_id(message_id).request_body(body.build()).build()


# ------------------------------------------------------------------------------------------
# FakeAnthropic with the real anthropic SDK
# ------------------------------------------------------------------------------------------


async def test_anthropic_non_streaming_text(fake_llm, llm):
    fake_llm.script(Text("Hi Alice!"))
    system = [{"type": "text", "text": "You are Ethan."}, {"type": "text", "text": "<user_profile>x</user_profile>"}]
    msg = await llm.messages.create(model=MODEL, max_tokens=64, system=system, messages=USER)
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hi Alice!"
    assert msg.stop_reason == "end_turn" and msg.model == MODEL and msg.id.startswith("msg_")
    [req] = fake_llm.requests
    assert msg.usage.input_tokens == req.input_tokens == estimate_tokens(req.json) > 0
    assert msg.usage.output_tokens >= 1
    # anthropic 2.x sends the API key as a bearer token, not x-api-key
    assert req.header("authorization") == "Bearer test" and req.kind == "chat" and not req.stream
    assert fake_llm.last_system_text() == "You are Ethan.\n<user_profile>x</user_profile>"
    assert fake_llm.user_texts(req) == ["hello"]


async def test_anthropic_streaming_text(fake_llm, llm):
    fake_llm.script(Text("streamed answer text"))
    chunks = []
    async with llm.messages.stream(model=MODEL, max_tokens=64, messages=USER) as stream:
        async for chunk in stream.text_stream:
            chunks.append(chunk)
        final = await stream.get_final_message()
    assert len(chunks) >= 2 and "".join(chunks) == "streamed answer text"
    assert final.content[0].text == "streamed answer text" and final.stop_reason == "end_turn"
    assert final.usage.input_tokens == fake_llm.requests[0].input_tokens
    assert final.usage.output_tokens >= 1 and fake_llm.requests[0].stream


async def test_anthropic_raw_event_sequence(fake_llm, llm):
    fake_llm.script(ToolUse("memory_write", {"content": "likes tea", "category": "preference"},
                            text_before="Noted."))
    tools = [{"name": "memory_write", "description": "d", "input_schema": {"type": "object"}}]
    stream = await llm.messages.create(model=MODEL, max_tokens=64, messages=USER, tools=tools, stream=True)
    events = [ev async for ev in stream]
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == types.count("content_block_stop") == 2
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "text_delta" in deltas and "input_json_delta" in deltas
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens >= 1


async def test_anthropic_tool_use_round(fake_llm, llm):
    tools = [{"name": "memory_write", "description": "save", "input_schema": {
        "type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}}]
    fake_llm.script(Turn(Text("Saving both."), ToolUse("memory_write", {"content": "A"}),
                         ToolUse("memory_write", {"content": "B 中文"})))
    async with llm.messages.stream(model=MODEL, max_tokens=64, messages=USER, tools=tools) as s:
        first = await s.get_final_message()
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert [u.input for u in uses] == [{"content": "A"}, {"content": "B 中文"}]
    assert len({u.id for u in uses}) == 2

    history = USER + [{"role": "assistant", "content": first.content}]
    # the fake rejects a tool loop that forgets a tool_result, like the real API
    with pytest.raises(anthropic.BadRequestError, match="without `tool_result`"):
        await llm.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=history + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "ok"}]}])
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        await llm.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=USER + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}])
    results = [{"type": "tool_result", "tool_use_id": u.id, "content": f"saved {i}"} for i, u in enumerate(uses)]
    second = await llm.messages.create(model=MODEL, max_tokens=64, tools=tools,
                                       messages=history + [{"role": "user", "content": results}])
    assert second.stop_reason == "end_turn" and second.content[0].text == "echo: saved 0 saved 1"


async def test_anthropic_routes_do_not_consume_the_chat_script(fake_llm, llm):
    fake_llm.script(Text("chat answer"))
    fake_llm.on_tool("write_summary", lambda req: {"summary": "S"}, keys={"summary"})
    tool = {"name": "write_summary", "description": "d", "input_schema": {
        "type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]}}
    forced = await llm.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=USER,
                                       tools=[tool], tool_choice={"type": "tool", "name": "write_summary"})
    assert forced.stop_reason == "tool_use" and forced.content[0].input == {"summary": "S"}
    structured = await llm.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=USER,
        output_config={"format": {"type": "json_schema", "schema": tool["input_schema"]}})
    assert json.loads(structured.content[0].text) == {"summary": "S"}
    # no route for this one: the default answers a minimal instance of the schema, not the script
    other = await llm.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=USER,
        tools=[{"name": "extract_memories", "description": "d", "input_schema": {
            "type": "object", "properties": {"facts": {"type": "array"}, "profile_psych": {"type": "array"}},
            "required": ["facts", "profile_psych"]}}],
        tool_choice={"type": "tool", "name": "extract_memories"})
    assert other.content[0].input == {"facts": [], "profile_psych": []}
    unrouted = await llm.messages.create(
        model="claude-haiku-4-5", max_tokens=64, messages=USER,
        output_config={"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"facts": {"type": "array"}}, "required": ["facts"]}}})
    assert json.loads(unrouted.content[0].text) == {"facts": []}
    chat = await llm.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert chat.content[0].text == "chat answer" and fake_llm.pending() == 0
    assert [r.kind for r in fake_llm.requests] == ["tool", "structured", "tool", "structured", "chat"]
    assert len(fake_llm.chat_requests()) == 1 and len(fake_llm.tool_requests("write_summary")) == 1


async def test_anthropic_429_with_retry_after(fake_llm, llm):
    fake_llm.script(Error.rate_limit(retry_after=1))
    with pytest.raises(anthropic.RateLimitError) as info:
        await llm.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert info.value.status_code == 429 and info.value.type == "rate_limit_error"
    assert info.value.response.headers["retry-after"] == "1"
    # with retries, the SDK honours retry-after and the scripted answer after it arrives
    fake_llm.script(Error.rate_limit(retry_after=0.2), Text("after retry"))
    retrying = llm.with_options(max_retries=1)
    t0 = time.monotonic()
    msg = await retrying.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert msg.content[0].text == "after retry" and time.monotonic() - t0 >= 0.18


async def test_anthropic_529_overloaded(fake_llm, llm):
    fake_llm.script(Error.overloaded())
    with pytest.raises(anthropic.InternalServerError) as info:
        await llm.messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert isinstance(info.value, anthropic.OverloadedError) and isinstance(info.value, anthropic.APIStatusError)
    assert info.value.status_code == 529 and info.value.type == "overloaded_error"


async def test_anthropic_spend_limit(fake_llm, llm):
    fake_llm.script(Error.spend_limit(), Text("never reached"))
    with pytest.raises(anthropic.RateLimitError) as info:
        await llm.with_options(max_retries=2).messages.create(model=MODEL, max_tokens=64, messages=USER)
    assert isinstance(info.value, anthropic.EnforcedSpendLimitReachedError)
    assert info.value.error_code == "enforced_spend_limit_reached"
    assert "usage limits" in info.value.api_message
    assert len(fake_llm.requests) == 1  # x-should-retry: false -> the SDK did not retry


async def test_anthropic_overload_mid_stream(fake_llm, llm):
    fake_llm.script(Error.overloaded(after_text="partial "))
    got = []
    with pytest.raises(anthropic.APIStatusError) as info:
        async with llm.messages.stream(model=MODEL, max_tokens=64, messages=USER) as s:
            async for chunk in s.text_stream:
                got.append(chunk)
    assert "".join(got) == "partial " and info.value.type == "overloaded_error"


async def test_anthropic_stall_and_reset(fake_llm, llm):
    fake_llm.script(Stall(seconds=5), Stall("half an ans", seconds=5), Stall(seconds=0))
    quick = llm.with_options(timeout=1.0)       # well under the stalls' 5 s
    with pytest.raises(anthropic.APITimeoutError):
        await quick.messages.create(model=MODEL, max_tokens=64, messages=USER)
    got = []
    # surprising but true: a read timeout *during* streaming escapes as the transport's
    # httpx2.ReadTimeout, or as anthropic.APITimeoutError, by where in the SDK's read the
    # deadline lands (0.2 s gave the first here, and the second on a busy CI machine; 1 s the
    # second): either way the half answer came first
    with pytest.raises((httpx2.TimeoutException, anthropic.APITimeoutError)):
        async with quick.messages.stream(model=MODEL, max_tokens=64, messages=USER) as s:
            async for chunk in s.text_stream:
                got.append(chunk)
    assert "".join(got) == "half an ans"
    with pytest.raises(anthropic.APIConnectionError):
        await llm.messages.create(model=MODEL, max_tokens=64, messages=USER)


async def test_anthropic_delay_latency_and_validation(fake_llm, llm):
    fake_llm.script(Delay(0.15, Text("late")))
    t0 = time.monotonic()
    assert (await llm.messages.create(model=MODEL, max_tokens=64, messages=USER)).content[0].text == "late"
    assert time.monotonic() - t0 >= 0.14
    with pytest.raises(anthropic.BadRequestError, match="non-empty"):
        await llm.messages.create(model=MODEL, max_tokens=64, messages=[
            {"role": "user", "content": [{"type": "text", "text": ""}]}])
    system = [{"type": "text", "text": str(i), "cache_control": {"type": "ephemeral"}} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
        await llm.messages.create(model=MODEL, max_tokens=64, system=system, messages=USER)


async def test_anthropic_prompt_cache_accounting_and_count_tokens(fake_llm, llm):
    fake_llm.cache_min_tokens = 10
    system = [{"type": "text", "text": "stable persona " * 10, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "volatile memory"}]
    first = await llm.messages.create(model=MODEL, max_tokens=64, system=system, messages=USER)
    second = await llm.messages.create(model=MODEL, max_tokens=64, system=system, messages=USER)
    assert first.usage.cache_creation_input_tokens > 0 and first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    total = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert total == fake_llm.requests[1].input_tokens
    count = await llm.messages.count_tokens(model=MODEL, system=system, messages=USER)
    assert count.input_tokens == total and len(fake_llm.count_tokens_requests) == 1
    assert system_text(fake_llm.requests[0].json).endswith("volatile memory")


def _cc(text: str) -> dict:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}


def _convo(turns: int, *, mark_last_stable: bool = True) -> list[dict]:
    """user/assistant turns, then a current input; a breakpoint on the last assistant block."""
    msgs: list[dict] = []
    for i in range(turns):
        msgs += [{"role": "user", "content": [{"type": "text", "text": f"question {i} " + "q" * 200}]},
                 {"role": "assistant", "content": [{"type": "text", "text": f"answer {i} " + "a" * 200}]}]
    if mark_last_stable and msgs:
        msgs[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return msgs + [{"role": "user", "content": f"now {turns}"}]


SYSTEM_4K = [_cc("persona " * 600)]           # 4,800 chars ~ 1,200 tokens


async def test_anthropic_cache_minimum_length_is_per_model(fake_llm, llm):
    """1,200 tokens caches on Sonnet (1,024) but not on Opus 4.5 / Haiku 4.5 (4,096): no error,
    nothing written, nothing read — the documented behaviour of a too-short prefix."""
    for model, cached in (("claude-sonnet-4-6", True), ("claude-opus-4-5", False),
                          ("claude-haiku-4-5", False), ("claude-opus-4-1", True)):
        a = await llm.messages.create(model=model, max_tokens=8, system=SYSTEM_4K, messages=USER)
        b = await llm.messages.create(model=model, max_tokens=8, system=SYSTEM_4K, messages=USER)
        assert (a.usage.cache_creation_input_tokens > 0) is cached, model
        assert (b.usage.cache_read_input_tokens > 0) is cached, model
        assert b.usage.cache_read_input_tokens in (0, a.usage.cache_creation_input_tokens)
        assert b.usage.input_tokens + b.usage.cache_read_input_tokens == fake_llm.requests[-1].input_tokens


async def test_anthropic_cache_reads_the_longest_prefix_within_the_20_block_lookback(fake_llm, llm):
    base = dict(model=MODEL, max_tokens=8, system=SYSTEM_4K)
    first = await llm.messages.create(**base, messages=_convo(3))
    assert first.usage.cache_read_input_tokens == 0
    written = first.usage.cache_creation_input_tokens
    assert written == fake_llm.requests[-1].input_tokens - first.usage.input_tokens
    # one more turn: the new breakpoint is 2 blocks past the old entry -> read it, write the rest
    second = await llm.messages.create(**base, messages=_convo(4))
    assert second.usage.cache_read_input_tokens == written
    assert second.usage.cache_creation_input_tokens > 0
    # twelve turns later the breakpoint is 24 blocks past the last entry: out of the lookback,
    # only the system's own breakpoint still reads its entry
    far = await llm.messages.create(**base, messages=_convo(16))
    assert far.usage.cache_read_input_tokens == math.ceil(len(SYSTEM_4K[0]["text"]) / 4)
    # ... unless an earlier breakpoint (the system) is within reach of its own entry
    fake_llm.clear()
    system = [_cc("persona " * 600), {"type": "text", "text": "memory", "cache_control": {"type": "ephemeral"}}]
    await llm.messages.create(model=MODEL, max_tokens=8, system=system, messages=_convo(3))
    changed = _convo(3)
    changed[0]["content"][0]["text"] = "a different first question"
    again = await llm.messages.create(model=MODEL, max_tokens=8, system=system, messages=changed)
    tools_system = await llm.messages.count_tokens(model=MODEL, system=system, messages=[USER[0]])
    assert 0 < again.usage.cache_read_input_tokens <= tools_system.input_tokens
    # the same text under the other role is another prefix: only the system part is read
    fake_llm.clear()
    await llm.messages.create(**base, messages=_convo(3))
    swapped = _convo(3)
    swapped[1]["role"], swapped[0]["role"] = "user", "assistant"
    swapped.insert(0, {"role": "user", "content": "hi"})
    miss = await llm.messages.create(**base, messages=swapped)
    assert miss.usage.cache_read_input_tokens == math.ceil(len(SYSTEM_4K[0]["text"]) / 4)


async def test_anthropic_cache_entries_live_five_minutes_from_last_use(fake_llm, llm):
    base = dict(model=MODEL, max_tokens=8, system=SYSTEM_4K, messages=USER)
    await llm.messages.create(**base)
    fake_llm.advance(200)
    assert (await llm.messages.create(**base)).usage.cache_read_input_tokens > 0    # refreshed
    fake_llm.advance(200)
    assert (await llm.messages.create(**base)).usage.cache_read_input_tokens > 0    # 200 s after use
    fake_llm.advance(301)
    gone = await llm.messages.create(**base)
    assert gone.usage.cache_read_input_tokens == 0 and gone.usage.cache_creation_input_tokens > 0
    hour = dict(base, system=[_cc("an hour " * 700)])
    hour["system"][0]["cache_control"]["ttl"] = "1h"
    await llm.messages.create(**hour)
    fake_llm.advance(1800)
    assert (await llm.messages.create(**hour)).usage.cache_read_input_tokens > 0
    fake_llm.caching = False
    off = await llm.messages.create(**hour)
    assert off.usage.cache_read_input_tokens == off.usage.cache_creation_input_tokens == 0


async def test_anthropic_rejects_the_neutral_cache_marker_on_the_wire(fake_llm, llm):
    with pytest.raises(anthropic.BadRequestError, match="Extra inputs"):
        await llm.messages.create(model=MODEL, max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache": True}]}])
    with pytest.raises(anthropic.BadRequestError, match="Extra inputs"):
        await llm.messages.create(model=MODEL, max_tokens=8, messages=USER,
                                  system=[{"type": "text", "text": "p", "cache": True}])


async def test_anthropic_wait_helpers(fake_llm, llm):
    with pytest.raises(RuntimeError, match="wait_for_requests_async"):
        fake_llm.wait_for_requests(1, timeout=0.1)  # would starve this loop
    task = asyncio.create_task(llm.messages.create(model=MODEL, max_tokens=64, messages=USER))
    [req] = await fake_llm.wait_for_requests_async(1, timeout=2)
    assert req.kind == "chat" and (await task).content[0].text == "echo: hello"
    with pytest.raises(AssertionError, match="expected 2"):
        await fake_llm.wait_for_requests_async(2, timeout=0.05)


# ------------------------------------------------------------------------------------------
# FakeLark with the real lark-oapi client
# ------------------------------------------------------------------------------------------


def test_lark_reply_via_sdk(fake_lark, client):
    event = load_fixture("p2p_text", fresh_ids=True)
    fake_lark.register_inbound(event)
    mid = event["event"]["message"]["message_id"]
    resp = client.im.v1.message.reply(reply_req(mid, "你好 Alice", uuid="u-1"))
    assert resp.success(), (resp.code, resp.msg)
    assert resp.data.message_id.startswith("om_fake_") and resp.data.chat_id == "oc_p2p_alice"
    assert json.loads(resp.data.body.content) == {"text": "你好 Alice"} and resp.data.parent_id == mid
    [msg] = fake_lark.messages()
    assert (msg.kind, msg.reply_to, msg.chat_id, msg.msg_type, msg.text, msg.uuid) == (
        "reply", mid, "oc_p2p_alice", "text", "你好 Alice", "u-1")
    assert fake_lark.token_fetches == 1
    [call] = fake_lark.calls_to("reply")
    assert call.header("authorization").startswith("Bearer t-") and call.json["uuid"] == "u-1"
    assert call.status == 200 and call.code == 0


def test_lark_each_fake_starts_with_a_fresh_token():
    # lark-oapi caches tokens process-wide by app_id; a new fake must not see the old token
    for _ in range(2):
        with FakeLark() as fake:
            client = (lark.Client.builder().app_id("cli_same").app_secret("s")
                      .domain(fake.base_url).log_level(lark.LogLevel.ERROR).build())
            assert client.im.v1.message.reply(reply_req("om_x", "hi")).success()
            assert fake.token_fetches == 1


def test_lark_uuid_idempotency(fake_lark, client):
    first = client.im.v1.message.reply(reply_req("om_x", "once", uuid="same"))
    again = client.im.v1.message.reply(reply_req("om_x", "once (retried)", uuid="same"))
    other = client.im.v1.message.reply(reply_req("om_x", "twice", uuid="other"))
    assert first.data.message_id == again.data.message_id != other.data.message_id
    assert [m.text for m in fake_lark.messages()] == ["once", "twice"]
    assert len(fake_lark.calls_to("reply")) == 3


def test_lark_rate_limit_fault_delivers_nothing(fake_lark, client):
    fake_lark.fail_next("/reply", **rate_limited(reset=1))
    failed = client.im.v1.message.reply(reply_req("om_x", "hi", uuid="k"))
    assert failed.code == 99991400 and failed.raw.status_code == 429
    assert failed.raw.headers["x-ogw-ratelimit-reset"] == "1"
    assert fake_lark.messages() == []
    fake_lark.fail_next("/reply", **chat_rate_limited())
    assert client.im.v1.message.reply(reply_req("om_x", "hi", uuid="k")).code == 230020
    ok = client.im.v1.message.reply(reply_req("om_x", "hi", uuid="k"))  # the same uuid, resent
    assert ok.success() and len(fake_lark.messages()) == 1


def test_lark_lost_response_then_uuid_retry(fake_lark, client):
    fake_lark.fail_next("/reply", deliver=True, **server_error())
    lost = client.im.v1.message.reply(reply_req("om_x", "hi", uuid="k"))
    assert lost.code == 1500 and lost.raw.status_code == 500
    assert len(fake_lark.messages()) == 1  # delivered although the answer was an error
    retry = client.im.v1.message.reply(reply_req("om_x", "hi", uuid="k"))
    assert retry.success() and retry.data.message_id == fake_lark.messages()[0].message_id
    assert len(fake_lark.messages()) == 1
    fake_lark.fail_next("/reply", disconnect=True)
    with pytest.raises(requests.ConnectionError):
        client.im.v1.message.reply(reply_req("om_x", "boom", uuid="k2"))
    assert len(fake_lark.messages()) == 1


def test_lark_token_expiry(fake_lark, client):
    base = fake_lark.base_url
    tok = requests.post(f"{base}/open-apis/auth/v3/tenant_access_token/internal",
                        json={"app_id": "cli_test", "app_secret": "s"}).json()
    assert tok["code"] == 0 and tok["expire"] == 7200 and tok["tenant_access_token"].startswith("t-")
    auth = {"Authorization": f"Bearer {tok['tenant_access_token']}"}
    assert requests.get(f"{base}/open-apis/bot/v3/info", headers=auth).json()["code"] == 0
    fake_lark.expire_tokens()
    expired = requests.get(f"{base}/open-apis/bot/v3/info", headers=auth)
    assert expired.status_code == 400 and expired.json()["code"] == 99991663
    missing = requests.get(f"{base}/open-apis/bot/v3/info")
    assert missing.json()["code"] == 99991661
    # lark-oapi caches its token process-wide and does not refresh on 99991663
    assert client.im.v1.message.reply(reply_req("om_x", "a")).success()
    fake_lark.expire_tokens()
    assert client.im.v1.message.reply(reply_req("om_x", "b")).code == 99991663
    assert fake_lark.token_fetches == 2 and len(fake_lark.messages()) == 1


async def test_lark_bot_info_shape_with_sdk_parser(fake_lark):
    from lark_oapi.channel.bot_identity import fetch_bot_identity

    config = (lark.Client.builder().app_id("cli_test").app_secret("s")
              .domain(fake_lark.base_url).log_level(lark.LogLevel.ERROR).build().config)
    # the token fetch inside is a blocking `requests` call: fine, the fake has its own thread
    identity = await fetch_bot_identity(config)
    assert identity is not None and identity.open_id == "ou_bot" and identity.name == "Ethan"
    raw = fake_lark.calls_to("/bot/v3/info")[0]
    assert raw.status == 200
    body = requests.get(f"{fake_lark.base_url}/open-apis/bot/v3/info",
                        headers={"Authorization": raw.header("Authorization")}).json()
    assert "data" not in body and body["bot"]["open_id"] == "ou_bot" and body["bot"]["activate_status"] == 2


def test_lark_cardkit_streaming(fake_lark, client):
    card = {"schema": "2.0", "config": {"streaming_mode": True, "update_multi": True},
            "body": {"elements": [{"tag": "markdown", "element_id": "md", "content": "…"}]}}
    created = client.cardkit.v1.card.create(CreateCardRequest.builder().request_body(
        CreateCardRequestBody.builder().type("card_json").data(json.dumps(card)).build()).build())
    assert created.success(), created.msg
    card_id = created.data.card_id
    ref = json.dumps({"type": "card", "data": {"card_id": card_id}})
    sent = client.im.v1.message.reply(reply_req("om_x", "", msg_type="interactive", content=ref, uuid="c"))
    assert sent.success(), sent.msg

    def content(text: str, seq: int, uuid: str | None = None):
        body = ContentCardElementRequestBody.builder().content(text).sequence(seq)
        if uuid:
            body = body.uuid(uuid)
        return client.cardkit.v1.card_element.content(ContentCardElementRequest.builder()
            .card_id(card_id).element_id("md").request_body(body.build()).build())

    assert content("Hel", 1).success()
    assert content("Hello", 2, uuid="u2").success()
    assert content("Hello", 2, uuid="u2").success()  # idempotent retry of the same operation
    stale = content("Hello?", 2)
    assert stale.code == 300317 and stale.raw.status_code == 400
    assert fake_lark.card_text(card_id) == "Hello"
    close = client.cardkit.v1.card.settings(SettingsCardRequest.builder().card_id(card_id).request_body(
        SettingsCardRequestBody.builder().settings(json.dumps({"config": {"streaming_mode": False}}))
        .sequence(3).build()).build())
    assert close.success()
    assert content("Hello again", 4).code == 300309  # streaming closed
    [msg] = fake_lark.messages()
    assert msg.card_id == card_id and msg.msg_type == "interactive" and msg.text == "Hello"
    state = fake_lark.card(card_id)
    assert not state.streaming_mode and state.sequence == 3
    assert [h["op"] for h in state.history] == ["content:md", "content:md", "settings"]
    unknown = client.cardkit.v1.card_element.content(
        ContentCardElementRequest.builder().card_id("404").element_id("md").request_body(
            ContentCardElementRequestBody.builder().content("x").sequence(1).build()).build())
    assert unknown.code == 200740


def test_lark_create_edit_react_and_limits(fake_lark, client):
    create = client.im.v1.message.create(CreateMessageRequest.builder().receive_id_type("chat_id")
        .request_body(CreateMessageRequestBody.builder().receive_id("oc_group_1").msg_type("post")
                      .content(json.dumps({"zh_cn": {"title": "T", "content": [[
                          {"tag": "text", "text": "line "}, {"tag": "a", "text": "link", "href": "x"}]]}}))
                      .build()).build())
    assert create.success()
    mid = create.data.message_id
    edit = client.im.v1.message.update(UpdateMessageRequest.builder().message_id(mid).request_body(
        UpdateMessageRequestBody.builder().msg_type("text").content(json.dumps({"text": "edited"})).build()).build())
    assert edit.success()
    [msg] = fake_lark.messages()
    assert (msg.kind, msg.chat_id, msg.receive_id_type, msg.edits, msg.text) == (
        "create", "oc_group_1", "chat_id", 1, "edited")
    assert msg.content["zh_cn"]["title"] == "T"  # the first version is kept in .content
    patch = client.im.v1.message.patch(PatchMessageRequest.builder().message_id(mid).request_body(
        PatchMessageRequestBody.builder().content("{}").build()).build())
    assert patch.code == 230001  # only cards can be patched
    react = client.im.v1.message_reaction.create(CreateMessageReactionRequest.builder().message_id(mid)
        .request_body(CreateMessageReactionRequestBody.builder().reaction_type(
            Emoji.builder().emoji_type("THUMBSUP").build()).build()).build())
    assert react.success() and react.data.reaction_type.emoji_type == "THUMBSUP"
    unreact = client.im.v1.message_reaction.delete(DeleteMessageReactionRequest.builder()
        .message_id(mid).reaction_id(react.data.reaction_id).build())
    assert unreact.success() and fake_lark.reactions()[0]["deleted"]
    too_long = client.im.v1.message.reply(reply_req(mid, "x" * (150 * 1024 + 1)))
    assert too_long.code == 230025
    fake_lark.recall_message(mid)
    assert client.im.v1.message.reply(reply_req(mid, "late")).code == 230011
    assert len(fake_lark.messages()) == 1


def test_lark_threads_contact_and_unknown_paths(fake_lark, client):
    event = make_text_event("hi", chat_id="oc_group_1", chat_type="group", mentions=["ou_bot"])
    fake_lark.register_inbound(event)
    mid = event["event"]["message"]["message_id"]
    first = client.im.v1.message.reply(reply_req(mid, "in thread", in_thread=True))
    second = client.im.v1.message.reply(reply_req(mid, "same thread"))
    assert first.data.thread_id and first.data.thread_id == second.data.thread_id
    assert [m.chat_id for m in fake_lark.messages()] == ["oc_group_1", "oc_group_1"]
    user = client.contact.v3.user.get(GetUserRequest.builder().user_id("ou_alice").user_id_type("open_id").build())
    assert user.success() and user.data.user.name == "Alice"
    batch = client.contact.v3.user.batch(BatchUserRequest.builder().user_ids(["ou_alice", "ou_bob"]).build())
    assert [u.name for u in batch.data.items] == ["Alice", "Bob"]
    assert len(fake_lark.calls_to("/contact/v3/users")) == 2
    nowhere = requests.get(f"{fake_lark.base_url}/open-apis/nowhere/v1/x")
    assert nowhere.status_code == 404 and nowhere.json()["code"] == 404


def test_lark_down_and_latency(fake_lark, client):
    fake_lark.set_down(5)
    down = requests.post(f"{fake_lark.base_url}/open-apis/auth/v3/tenant_access_token/internal", json={})
    assert down.status_code == 503 and "json" not in down.headers["Content-Type"]
    fake_lark.set_down(5, mode="reset")
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{fake_lark.base_url}/open-apis/bot/v3/info")
    fake_lark.set_down(0)
    fake_lark.latency = 0.15
    t0 = time.monotonic()
    assert client.im.v1.message.reply(reply_req("om_x", "slow")).success()
    assert time.monotonic() - t0 >= 0.3  # token fetch + reply, each delayed
    assert len(fake_lark.messages()) == 1


def test_lark_chat_qps_and_wait(fake_lark, client):
    event = make_text_event("hi", chat_id="oc_g", chat_type="group")
    fake_lark.register_inbound(event)
    mid = event["event"]["message"]["message_id"]
    fake_lark.enforce_chat_qps = 2
    codes = [client.im.v1.message.reply(reply_req(mid, str(i))).code for i in range(3)]
    assert codes == [0, 0, 230020]
    assert fake_lark.max_sends_per_second("oc_g") == 2 == fake_lark.max_sends_per_second()
    with pytest.raises(AssertionError, match="expected 3 delivered"):
        fake_lark.wait_for_messages(3, timeout=0.05)
    assert len(fake_lark.wait_for_messages(2, timeout=0.5, chat_id="oc_g")) == 2


async def test_lark_wait_async(fake_lark, client):
    with pytest.raises(RuntimeError, match="wait_for_messages_async"):
        fake_lark.wait_for_messages(1, timeout=0.05)
    threading.Timer(0.05, lambda: client.im.v1.message.reply(reply_req("om_x", "later"))).start()
    [msg] = await fake_lark.wait_for_messages_async(1, timeout=2)
    assert msg.text == "later"


# ------------------------------------------------------------------------------------------
# Events, encryption and signatures
# ------------------------------------------------------------------------------------------

KEY = "test key"


def test_decrypt_documented_vector():
    assert decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", KEY) == b"hello world"
    with pytest.raises(ValueError):
        decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "wrong key")


def test_encrypt_round_trip_and_sdk_cipher():
    token = encrypt("你好 hello", KEY)
    assert token != encrypt("你好 hello", KEY)  # random IV
    assert decrypt(token, KEY).decode() == "你好 hello"
    assert AESCipher(KEY).decrypt_str(token) == "你好 hello"  # lark-oapi's own cipher agrees


def test_sign_formula():
    body = b'{"encrypt":"abc"}'
    import hashlib

    assert sign("1700000000", "nonce", KEY, body) == hashlib.sha256(b"1700000000nonce" + KEY.encode() + body).hexdigest()


def _dispatch(headers: dict, body: bytes, *, encrypt_key: str, token: str, seen: list):
    handler = (lark.EventDispatcherHandler.builder(encrypt_key, token, lark.LogLevel.CRITICAL)
               .register_p2_im_message_receive_v1(seen.append).build())
    req = RawRequest()
    req.uri, req.headers, req.body = "/lark/events", headers, body
    return handler.do(req)


def test_webhook_request_accepted_by_sdk_dispatcher():
    event = make_text_event("@_user_1 总结一下", chat_id="oc_group_1", chat_type="group",
                            mentions=["ou_bot", "ou_bob"])
    headers, body = webhook_request(event, encrypt_key=KEY, verification_token="tok-2")
    assert set(json.loads(body)) == {"encrypt"}
    seen: list = []
    resp = _dispatch(headers, body, encrypt_key=KEY, token="tok-2", seen=seen)
    assert resp.status_code == 200, resp.content
    [parsed] = seen
    message = parsed.event.message
    assert parsed.header.event_id == event["header"]["event_id"]
    assert message.chat_type == "group" and json.loads(message.content)["text"].startswith("@_user_2 @_user_1")
    assert [m.id.open_id for m in message.mentions] == ["ou_bot", "ou_bob"]
    assert parsed.event.sender.sender_id.open_id == "ou_alice"
    # a tampered body fails the signature check
    tampered = body.replace(b'"}', b'A"}') if body.endswith(b'"}') else body + b" "
    assert _dispatch(headers, tampered, encrypt_key=KEY, token="tok-2", seen=[]).status_code == 500
    # plain (unencrypted) requests carry the verification token
    h2, b2 = webhook_request(event, verification_token="tok-2")
    assert json.loads(b2)["header"]["token"] == "tok-2" and "X-Lark-Signature" not in h2
    assert _dispatch(h2, b2, encrypt_key="", token="tok-2", seen=[]).status_code == 200
    assert _dispatch(h2, b2, encrypt_key="", token="other", seen=[]).status_code == 500


def test_url_verification_and_fixtures(monkeypatch, tmp_path):
    headers, body = webhook_request(url_verification("ch-1", "vtoken"), encrypt_key=KEY)
    resp = _dispatch(headers, body, encrypt_key=KEY, token="vtoken", seen=[])
    assert json.loads(resp.content) == {"challenge": "ch-1"}
    before = int(time.time() * 1000)
    ev = load_fixture("group_mention")
    assert int(ev["header"]["create_time"]) >= before and ev["event"]["message"]["create_time"] == ev["header"]["create_time"]
    assert ev["event"]["message"]["message_id"] == "om_grp_0001"
    a, b = load_fixture("p2p_text", fresh_ids=True), load_fixture("p2p_text", fresh_ids=True)
    assert a["header"]["event_id"] != b["header"]["event_id"]
    assert a["event"]["message"]["message_id"] != b["event"]["message"]["message_id"]
    (tmp_path / "custom.json").write_text(json.dumps({"schema": "2.0", "header": {"create_time": "1"}}))
    monkeypatch.setenv("ETHAN_FIXTURES", str(tmp_path))
    assert int(load_fixture("custom")["header"]["create_time"]) >= before
