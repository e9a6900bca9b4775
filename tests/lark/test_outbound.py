"""LarkSender and LarkReply against the fake Lark Open API (real aiohttp client, loopback).

Delays are injected small (backoff in tens of milliseconds, short budgets) so the
retry paths run quickly; rate assertions count recorded call timestamps, they never
assert speed.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import structlog

from bot.lark.openapi.client import LarkApiError, OpenApi
from bot.lark.outbound.ratelimit import KeyedRateLimiter
from bot.lark.outbound import (
    LarkReply,
    LarkSender,
    RetryPolicy,
    derive_uuid,
    looks_like_markdown,
    render,
    split_text,
)
from bot.delivery.outbox_store import Outbox
from storage.sqlite import SqliteDatabase
from tests.fakes.fake_lark import FakeLark, chat_rate_limited, rate_limited, server_error

CHAT = "oc_chat1"
FAST_CARD = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05, budget_s=1.0,
                        max_retry_after=0.5, jitter=0)


async def wait_for(cond, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def inbound_event(message_id: str, chat_id: str = CHAT, text: str = "hi") -> dict:
    return {
        "schema": "2.0",
        "header": {"event_type": "im.message.receive_v1", "event_id": "ev_" + message_id},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
            "message": {
                "message_id": message_id, "chat_id": chat_id, "chat_type": "group",
                "message_type": "text", "content": json.dumps({"text": text}),
            },
        },
    }


@pytest.fixture
def fake():
    lark = FakeLark()
    lark.start()
    try:
        yield lark
    finally:
        lark.stop()


@pytest.fixture
async def api(fake):
    client = OpenApi("cli_test", "secret", fake.base_url, timeout=5)
    try:
        yield client
    finally:
        await client.aclose()


class Sleeps:
    """Injected sleep: records the delays asked for, sleeps them for real."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(seconds)


@pytest.fixture
def sleeps():
    return Sleeps()


@pytest.fixture
def make_sender(api, sleeps):
    def make(**kw) -> LarkSender:
        opts = dict(base_delay=0.02, max_delay=0.1, budget_s=3.0, max_retry_after=1.0, jitter=0,
                    card_policy=FAST_CARD, reaction_policy=FAST_CARD, sleep=sleeps)
        opts.update(kw)
        return LarkSender(api, **opts)

    return make


def message_at(fake: FakeLark, mid: str = "om_user1", chat_id: str = CHAT) -> str:
    fake.register_inbound(inbound_event(mid, chat_id))
    return mid


# ---- retries, by the classification table ---------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [rate_limited(0.2), rate_limited(0.2, status=400), chat_rate_limited()],
    ids=["429+99991400", "400+99991400", "230020"],
)
async def test_rate_limited_reply_is_resent_with_the_same_uuid_once(fake, make_sender, sleeps, fault):
    sender = make_sender()
    mid = message_at(fake)
    fake.fail_next("/reply", **fault)
    new_id = await sender.reply(mid, "text", {"text": "hello"}, uuid="u-rl", chat_id=CHAT)

    [msg] = fake.messages()
    assert msg.message_id == new_id and msg.uuid == "u-rl" and msg.text == "hello"
    calls = fake.calls_to("/reply")
    assert len(calls) == 2
    assert [c.json["uuid"] for c in calls] == ["u-rl", "u-rl"]
    if "x-ogw-ratelimit-reset" in fault.get("headers", {}):
        assert 0.2 in sleeps.delays  # waited what the gateway said


async def test_lost_response_is_retried_without_doubling(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    fake.fail_next("/reply", deliver=True, **server_error(500))       # processed, answer lost
    await sender.reply(mid, "text", {"text": "one"}, uuid="u-lost", chat_id=CHAT)
    fake.fail_next("/reply", deliver=True, disconnect=True)            # processed, connection reset
    await sender.reply(mid, "text", {"text": "two"}, uuid="u-lost2", chat_id=CHAT)

    assert [m.text for m in fake.messages()] == ["one", "two"]
    assert len(fake.calls_to("/reply")) == 4


@pytest.mark.parametrize("mode", ["503", "reset"])
async def test_open_api_down_for_a_while_still_delivers_once(fake, make_sender, mode):
    sender = make_sender(base_delay=0.05, max_delay=0.2, budget_s=60.0, max_attempts=50)
    mid = message_at(fake)
    await sender.add_reaction(mid)  # token fetched before the outage
    # Down until the fake has turned away three reply attempts, then up: an outage of a fixed
    # 0.8 s could be over before a starved test process sent its first attempt (no retry at
    # all), or outlast the attempts on a loaded machine.
    fake.set_down(60, mode=mode)

    async def back_up_after_three_attempts() -> None:
        await wait_for(lambda: len(fake.calls_to("/reply")) >= 3, 60)
        fake.set_down(0)

    outage = asyncio.create_task(back_up_after_three_attempts())
    with structlog.testing.capture_logs() as logs:
        await sender.reply(mid, "text", {"text": "after the outage"}, uuid="u-down", chat_id=CHAT)
    await outage

    assert [(m.text, m.uuid) for m in fake.messages()] == [("after the outage", "u-down")]
    retries = [e for e in logs if e["event"] == "lark.send.retry"]
    assert len(retries) >= 3 and all(e["category"] == "transient" for e in retries)
    assert not [e for e in logs if e["event"] == "reply.failed"]


async def test_open_api_down_too_long_gives_up_with_a_log_line_then_resend_dedups(fake, make_sender):
    sender = make_sender(base_delay=0.05, max_delay=0.1, budget_s=0.5, max_attempts=1000)
    mid = message_at(fake)
    fake.set_down(30)
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(LarkApiError) as ei:
            await sender.reply(mid, "text", {"text": "late"}, uuid="u-late", chat_id=CHAT)
    assert ei.value.transient
    assert fake.messages() == []
    assert len(fake.calls_to("/reply")) < 20  # the time budget, not max_attempts, ended it
    [failed] = [e for e in logs if e["event"] == "reply.failed"]
    assert failed["chat_id"] == CHAT and failed["message_id"] == mid
    assert {"code", "log_id", "category"} <= failed.keys()

    # back up: the message is processed again (same uuid) -- delivered once, and a further
    # resend of the same reply is deduplicated by Lark
    fake.set_down(0)
    await sender.reply(mid, "text", {"text": "late"}, uuid="u-late", chat_id=CHAT)
    await sender.reply(mid, "text", {"text": "late"}, uuid="u-late", chat_id=CHAT)
    assert [m.uuid for m in fake.messages()] == ["u-late"]


async def test_failure_logs_lark_log_id(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    fake.fail_next("/reply", status=400, code=230002, msg="The bot can not be outside the group.")
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(LarkApiError):
            await sender.reply(mid, "text", {"text": "x"}, uuid="u-perm", chat_id=CHAT)
    assert len(fake.calls_to("/reply")) == 1  # not retried
    [failed] = [e for e in logs if e["event"] == "reply.failed"]
    assert failed["code"] == 230002 and failed["category"] == "permission"
    assert failed["log_id"].startswith("fake")


async def test_reply_to_recalled_message_becomes_a_fresh_message_once(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    fake.recall_message(mid)
    first = await sender.reply(mid, "text", {"text": "still here"}, uuid="u-gone", chat_id=CHAT)
    again = await sender.reply(mid, "text", {"text": "still here"}, uuid="u-gone", chat_id=CHAT)

    [msg] = fake.messages()
    assert first == again == msg.message_id
    assert msg.kind == "create" and msg.chat_id == CHAT and msg.receive_id_type == "chat_id"
    assert msg.uuid == derive_uuid("u-gone", "fresh")


async def test_reply_in_thread(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    await sender.reply(mid, "text", {"text": "threaded"}, uuid="u-th", chat_id=CHAT, in_thread=True)
    [msg] = fake.messages()
    assert msg.reply_in_thread and msg.thread_id


# ---- per-chat rate --------------------------------------------------------------------------


async def test_burst_of_20_sends_stays_within_5_per_second_per_chat(fake, make_sender):
    sender = make_sender()
    fake.enforce_chat_qps = 5  # the fake answers 230020 above 5 per chat per second
    await sender.add_reaction(message_at(fake))  # token fetched before the burst

    await asyncio.gather(*(
        sender.send("oc_burst", "text", {"text": f"m{i}"}, uuid=f"burst-{i}") for i in range(20)
    ))

    assert len(fake.messages(chat_id="oc_burst")) == 20
    assert fake.max_sends_per_second("oc_burst") <= 5
    assert not [c for c in fake.calls_to("/im/v1/messages", "POST") if c.code == 230020]


async def test_chats_do_not_wait_for_each_other(fake, make_sender):
    sender = make_sender()
    await sender.add_reaction(message_at(fake))
    await asyncio.gather(*(
        sender.send(f"oc_many_{i}", "text", {"text": "x"}, uuid=f"many-{i}") for i in range(10)
    ))
    # ten chats, one send each: no send waited on the limiter
    assert len(fake.messages()) == 10
    assert fake.max_sends_per_second() <= 5
    starts = sorted(c.at for c in fake.calls_to("/im/v1/messages", "POST"))
    assert starts[-1] - starts[0] < 1.0  # not serialised at 5/s (that would take >= 1.8 s)


# ---- LarkReply: plain text ------------------------------------------------------------------


async def test_short_answer_is_one_text_reply_with_working_reaction_removed(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, working_after_s=0.2)
    await reply.working()
    await reply.stream("Hel")
    await asyncio.sleep(0.5)                  # slower than working_after_s: the sign shows
    await reply.finish("Hello there")

    [msg] = fake.messages()
    assert (msg.kind, msg.reply_to, msg.msg_type, msg.text) == ("reply", mid, "text", "Hello there")
    assert msg.uuid == f"{mid}-0"
    [reaction] = fake.reactions()
    assert reaction["message_id"] == mid and reaction["emoji_type"] == "Typing"
    assert reaction["deleted"]
    assert reply.delivered_as == "text" and fake.cards() == []


async def test_quick_answer_shows_no_working_reaction(fake, make_sender):
    """An answer ready before ``working_after_s`` costs one Open API call, not three."""
    sender = make_sender()
    mid = message_at(fake)
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, working_after_s=0.5)
    await reply.working()
    await reply.finish("Quick")
    await asyncio.sleep(0.7)                  # the cancelled sign must not appear later either
    assert [m.text for m in fake.messages()] == ["Quick"]
    assert fake.reactions() == [] and fake.calls_to("/reactions") == []


async def test_markdown_answer_goes_as_post_with_md(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "## Plan\n\n- one\n- two\n\n```python\nprint('hi')\n```"
    await LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid).finish(answer)
    [msg] = fake.messages()
    assert msg.msg_type == "post"
    assert msg.content == {"zh_cn": {"content": [[{"tag": "md", "text": answer}]]}}


async def test_reprocessing_the_same_message_sends_nothing_new(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    text = "para one\n\n" + "x" * 5000
    for _ in range(2):  # e.g. a crash after sending, then the inbox replays the message
        await LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, text_limit=4000).finish(text)
    assert len(fake.messages()) == 2  # two chunks, once


async def test_long_text_is_split_into_readable_chunks(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    paragraphs = [f"Paragraph {i}. " + ("word " * 150).strip() for i in range(20)]
    text = "\n\n".join(paragraphs)  # ~15 000 chars
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid)
    await reply.finish(text)

    msgs = fake.messages()
    assert len(msgs) >= 4
    assert [m.uuid for m in msgs] == [f"{mid}-{i}" for i in range(len(msgs))]
    assert all(len(m.text) <= 4000 for m in msgs)
    # every chunk ends on a paragraph boundary, and nothing is lost or reordered
    assert all(m.text.rstrip().endswith(tuple(p[-20:] for p in paragraphs)) for m in msgs)
    assert re.sub(r"\s+", "", "".join(m.text for m in msgs)) == re.sub(r"\s+", "", text)


# ---- LarkReply: streaming card --------------------------------------------------------------


async def _stream(reply: LarkReply, answer: str, step: int = 40, pause: float = 0.01) -> int:
    calls = 0
    for end in range(step, len(answer) + step, step):
        await reply.stream(answer[:end])
        calls += 1
        await asyncio.sleep(pause)
    return calls


def _card_ops(fake: FakeLark, card_id: str) -> list[dict]:
    return fake.card(card_id).history


async def test_long_answer_streams_into_a_card(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "\n\n".join(f"**Point {i}.** " + ("lorem ipsum " * 12).strip() for i in range(12))
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_min_chars=200, card_update_interval=0.05, working_after_s=0)
    await reply.working()
    stream_calls = await _stream(reply, answer)
    await reply.finish(answer)

    [msg] = fake.messages()
    assert msg.msg_type == "interactive" and msg.kind == "reply" and msg.reply_to == mid
    [card] = fake.cards()
    assert msg.uuid == derive_uuid(mid, "card", card.card_id)   # no ledger: named after the entity
    assert msg.card_id == card.card_id and card.sent_as == msg.message_id
    assert card.text == answer                      # the final card text is the full answer
    assert card.streaming_mode is False             # streaming closed
    ops = card.history
    seqs = [op["sequence"] for op in ops]
    assert seqs == sorted(set(seqs)) and seqs[0] >= 1  # strictly increasing
    assert ops[-1]["op"] == "settings"
    content_ops = [op for op in ops if op["op"].startswith("content")]
    assert 1 <= len(content_ops) < stream_calls     # coalesced, not one push per token
    times = [op["at"] for op in content_ops]
    assert all(sum(1 for u in times if t <= u < t + 1.0) <= 10 for t in times)  # CardKit 10/s
    assert reply.delivered_as == "card"
    assert fake.reactions()[0]["deleted"]


async def test_card_pushes_are_spaced_by_the_update_interval(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "word " * 120
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_min_chars=20, card_update_interval=0.3)
    await _stream(reply, answer, step=5, pause=0.01)  # ~120 calls over ~1.2 s
    await reply.finish(answer)

    [card] = fake.cards()
    assert card.text == answer.strip()
    content = [op["at"] for op in card.history if op["op"].startswith("content")]
    streamed = content[:-1]  # the final push is sent at finish(), whatever the interval
    gaps = [b - a for a, b in zip(streamed, streamed[1:])]
    assert gaps and min(gaps) >= 0.25, gaps


async def test_streamed_answer_processed_again_after_a_crash_is_visible(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "Streamed answer. " * 40
    for run in range(2):  # the second run: the inbox replays the message after a crash
        reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                          stream_min_chars=50, card_update_interval=0.05)
        await _stream(reply, answer, step=100)
        await reply.finish(answer)
        shown = fake.message(reply.card_message_id)
        assert shown.card_id == reply.card_id  # the message shows the entity we streamed into
        assert fake.card_text(shown.card_id) == answer.strip()


async def test_card_ledger_finishes_the_card_left_by_a_crashed_run(fake, make_sender, tmp_path):
    """With the outbox as ledger, the second run (the inbox replays the message after a crash
    in the middle of streaming) adopts the card on screen: one message, one card, the full
    answer, streaming closed; sequences keep increasing across the two runs."""
    db = await SqliteDatabase(tmp_path / "e.db").open()
    try:
        ledger = Outbox(db)
        sender = make_sender()
        mid = message_at(fake)
        answer = "Streamed answer. " * 40
        first = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, cards=ledger,
                          stream_min_chars=50, card_update_interval=0.05)
        await _stream(first, answer[:300], step=100)
        await wait_for(lambda: first.card_message_id, 5)
        first._worker.cancel()                     # the crash: the card stays half written
        second = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, cards=ledger,
                           resumed=True, stream_min_chars=50, card_update_interval=0.05)
        await _stream(second, answer, step=100)
        await second.finish(answer)
        [msg] = fake.messages()
        assert msg.uuid == derive_uuid(mid, "card") and second.card_id == first.card_id == msg.card_id
        [card] = fake.cards()
        assert card.text == answer.strip() and card.streaming_mode is False
        row = await db.fetchone("SELECT status, card_id, lark_message_id FROM outbox")
        assert tuple(row) == ("sent", card.card_id, msg.message_id)

        # A replayed answer (no streaming this time) to the same message lands in the card too.
        third = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, cards=ledger, resumed=True)
        await third.finish("Short replay.")
        assert len(fake.messages()) == 1 and fake.card_text(card.card_id) == "Short replay."
        assert third.delivered_as == "card"
    finally:
        await db.close()


async def test_slow_answer_switches_to_a_card_after_stream_after_s(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_after_s=0.15, stream_min_chars=10_000, card_update_interval=0.05)
    await reply.stream("Thinking about it")
    await asyncio.sleep(0.2)
    await reply.stream("Thinking about it, the answer is")
    await asyncio.sleep(0.1)
    await reply.finish("Thinking about it, the answer is 42.")
    [card] = fake.cards()
    assert card.text == "Thinking about it, the answer is 42." and not card.streaming_mode
    assert [m.msg_type for m in fake.messages()] == ["interactive"]


async def test_card_push_failure_falls_back_to_text_exactly_once(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "A long answer. " * 60
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_min_chars=100, card_update_interval=0.02)
    fake.fail_next("/content", times=1000, **server_error(500))
    await _stream(reply, answer, step=100)
    await reply.finish(answer)
    await reply.finish(answer)  # a second finish is ignored

    msgs = fake.messages()
    assert [m.msg_type for m in msgs] == ["interactive", "text"]
    assert msgs[1].text == answer.strip() and msgs[1].uuid == f"{mid}-0"  # finish() strips
    assert reply.delivered_as == "text-fallback"


async def test_card_create_failure_falls_back_to_text_exactly_once(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "Another long answer. " * 50
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, stream_min_chars=100)
    fake.fail_next("/cardkit/v1/cards", method="POST", times=1000, status=400, code=200220)
    await _stream(reply, answer, step=100)
    await reply.finish(answer)
    msgs = fake.messages()
    assert [m.msg_type for m in msgs] == ["text"] and msgs[0].text == answer.strip()


async def test_card_final_push_failure_falls_back_to_text(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "Final push will fail. " * 40
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_min_chars=100, card_update_interval=10)  # only the final push
    await reply.stream(answer[:300])
    await asyncio.sleep(0.1)
    fake.fail_next("/content", times=1000, status=400, code=300309)
    await reply.finish(answer)
    msgs = fake.messages()
    assert [m.msg_type for m in msgs] == ["interactive", "text"]
    assert msgs[1].text == answer.strip()


async def test_very_long_streamed_answer_overflows_into_follow_up_messages(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    answer = "\n\n".join(f"Section {i}: " + "data " * 200 for i in range(40))  # ~40 KB
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid,
                      stream_min_chars=100, card_update_interval=0.05)
    await reply.stream(answer[:2000])
    await asyncio.sleep(0.1)
    await reply.finish(answer)

    msgs = fake.messages()
    assert msgs[0].msg_type == "interactive" and len(msgs) >= 2
    [card] = fake.cards()
    assert not card.streaming_mode and len(card.text.encode()) <= 24_000
    joined = card.text + "".join(m.text for m in msgs[1:])
    assert re.sub(r"\s+", "", joined) == re.sub(r"\s+", "", answer)
    assert [m.uuid for m in msgs[1:]] == [f"{mid}-card-{i}" for i in range(len(msgs) - 1)]


async def test_recalled_message_still_gets_the_answer(fake, make_sender):
    sender = make_sender()
    mid = message_at(fake)
    fake.recall_message(mid)
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, working_after_s=0)
    await reply.working()  # reaction fails (message gone): ignored
    await reply.finish("answer anyway")
    [msg] = fake.messages()
    assert msg.kind == "create" and msg.chat_id == CHAT and msg.text == "answer anyway"


# ---- wire shapes match lark-oapi's request body models --------------------------------------


async def test_request_bodies_use_the_sdk_field_names(fake, make_sender):
    from lark_oapi.api.cardkit.v1.model.content_card_element_request_body import (
        ContentCardElementRequestBody,
    )
    from lark_oapi.api.cardkit.v1.model.create_card_request_body import CreateCardRequestBody
    from lark_oapi.api.cardkit.v1.model.settings_card_request_body import SettingsCardRequestBody
    from lark_oapi.api.im.v1.model.create_message_reaction_request_body import (
        CreateMessageReactionRequestBody,
    )
    from lark_oapi.api.im.v1.model.create_message_request_body import CreateMessageRequestBody
    from lark_oapi.api.im.v1.model.reply_message_request_body import ReplyMessageRequestBody

    sender = make_sender()
    mid = message_at(fake)
    reply = LarkReply(sender, message_id=mid, chat_id=CHAT, uuid_base=mid, working_after_s=0, stream_min_chars=10,
                      card_update_interval=0.02)
    await reply.working()
    await reply.stream("streaming text here")
    await asyncio.sleep(0.05)
    await reply.finish("streaming text here, done")
    await sender.send(CHAT, "text", {"text": "x"}, uuid="shape-send")

    models = {
        ("POST", "/reply"): ReplyMessageRequestBody,
        ("POST", "/reactions"): CreateMessageReactionRequestBody,
        ("POST", "/cardkit/v1/cards"): CreateCardRequestBody,
        ("PUT", "/content"): ContentCardElementRequestBody,
        ("PATCH", "/settings"): SettingsCardRequestBody,
    }
    seen = set()
    for call in fake.calls:
        if call.path.endswith("/im/v1/messages") and call.method == "POST":
            assert set(call.json) <= set(CreateMessageRequestBody._types), call.json
            seen.add("create")
        for (method, suffix), model in models.items():
            if call.method == method and call.path.endswith(suffix):
                assert set(call.json) <= set(model._types), (call.path, call.json)
                seen.add(suffix)
    assert seen == {"create", *(s for _, s in models)}


# ---- pure helpers ---------------------------------------------------------------------------


async def test_rate_limiter_spaces_calls_per_key_and_frees_idle_buckets():
    now = [0.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    limiter = KeyedRateLimiter(5, clock=lambda: now[0], sleep=sleep, sweep_every=1000)
    for _ in range(6):
        await limiter.acquire("chat-a")
    assert slept == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])  # evenly spaced, FIFO
    await limiter.acquire("chat-b")  # another chat does not wait
    assert len(slept) == 5
    for i in range(50):
        limiter.reserve(f"chat-{i}")
    assert len(limiter) == 52
    now[0] = 0.5
    assert limiter.sweep() == 51  # chat-b and every chat-N are full again; chat-a still queued
    now[0] = 2.0
    limiter.sweep()
    assert len(limiter) == 0  # chat-a's queue drained too: nothing is kept for idle chats


def test_split_text_keeps_code_fences_balanced():
    code = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(800)) + "\n```"
    chunks = split_text("Intro\n\n" + code + "\n\nOutro", limit=1000)
    assert len(chunks) > 3
    for c in chunks:
        assert len(c) <= 1000
        assert c.count("```") % 2 == 0, c[:80]


def test_split_text_cuts_cjk_on_sentence_ends():
    text = "这是一个很长的句子，用来测试切分。" * 400
    chunks = split_text(text, limit=500)
    assert all(len(c) <= 500 for c in chunks)
    assert all(c.endswith("。") for c in chunks)
    assert "".join(chunks) == text


def test_uuid_is_deterministic_and_within_lark_limit():
    long_base = "om_" + "a" * 60
    assert derive_uuid(long_base, "card") == derive_uuid(long_base, "card")
    assert len(derive_uuid(long_base, "card")) <= 50
    assert derive_uuid(long_base, 0) != derive_uuid(long_base, 1)
    assert derive_uuid("om_x", 3) == "om_x-3"


def test_render_picks_text_for_prose_and_post_for_markdown():
    assert render("just a sentence.")[0] == "text"
    assert looks_like_markdown("1. first\n2. second")
    assert render("see `code` here")[0] == "post"


@pytest.mark.timeout(30)
def test_an_answer_of_blank_lines_is_classified_in_linear_time():
    """Issue 45 sweep: the list / quote / fence branches began ``^\\s*``, which ran on across
    newlines — each of n blank lines scanned to the end (6,000: 1.5 s on the loop; 60,000,
    minutes). Indentation is spaces and tabs only now; the answers are classified as before."""
    assert not looks_like_markdown("\n" * 60_000 + "ok")
    assert looks_like_markdown("\n" * 60_000 + "  - item")
    assert looks_like_markdown("text\n\n   > quoted")
    assert looks_like_markdown("intro\n\t```\ncode\n```")
