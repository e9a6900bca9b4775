"""Load (issue item 9): many conversations, each sending its messages one after the other,
all interleaved (Lark pushes events concurrently).

Every message is acknowledged within Lark's 3 s and answered exactly once; per chat the
answers arrive in the order of the questions (the fake model echoes the question); the log
holds nothing at error level.

The server is ``python -m bot serve`` in a subprocess (its own core; its JSON log on stderr
is read back). Default: 100 conversations x 4 messages; slow: 500 x 4.
"""

from __future__ import annotations

import asyncio
import re
import time
import zlib
from typing import Awaitable, Callable

import aiohttp
import pytest

from tests.fakes.fake_anthropic import Delay, Text, last_user_text
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness
from tests.reliability.support import bot_mention, deliveries_by_trigger, post_event, wait_until

TOKEN = re.compile(r"conv(\d+)-seq(\d+)")
Post = Callable[[dict], Awaitable["int | None"]]


async def _drive(post: Post, lark, *, conversations: int, per_conv: int, concurrency: int = 16) -> dict:
    events: dict[str, tuple[int, int]] = {}
    ack_times: list[float] = []
    bad: list = []
    sem = asyncio.Semaphore(concurrency)

    async def conversation(c: int) -> None:
        group = c % 10 == 9                      # every tenth conversation is a group
        for k in range(per_conv):
            text = f"conv{c}-seq{k} please answer"
            if group:
                ev = make_text_event("@_user_bot " + text, chat_id=f"oc_group_{c}", chat_type="group",
                                     sender=f"ou_m{k % 3}_{c}", mentions=[bot_mention()])
            else:
                ev = make_text_event(text, chat_id=f"oc_p2p_{c}", sender=f"ou_u{c}")
            events[ev["event"]["message"]["message_id"]] = (c, k)
            async with sem:
                t0 = time.monotonic()
                status = await post(ev)
                ack_times.append(time.monotonic() - t0)
            if status != 200:
                bad.append((c, k, status))

    # One event first: the first request after a start is slow for a known reason, tested
    # on its own (test_crash.py::test_events_right_after_a_restart_are_acknowledged_within_3_seconds).
    warm = make_text_event("warm up", chat_id="oc_p2p_warm", sender="ou_warm")
    assert await post(warm) == 200
    t0 = time.monotonic()
    await asyncio.gather(*(conversation(c) for c in range(conversations)))
    sent_s = time.monotonic() - t0
    total = conversations * per_conv
    await wait_until(lambda: len(deliveries_by_trigger(lark)) >= total + 1, 60 + total * 0.1, f"{total} answers")
    answered_s = time.monotonic() - t0
    await asyncio.sleep(0.5)

    assert not bad, bad[:5]
    assert max(ack_times) < 3.0, f"slowest acknowledgement {max(ack_times):.2f}s"
    delivered = deliveries_by_trigger(lark)
    delivered.pop(warm["event"]["message"]["message_id"], None)
    assert set(delivered) == set(events)
    assert all(n == 1 for n in delivered.values()), [m for m, n in delivered.items() if n != 1][:5]
    seen: dict[int, list[int]] = {}
    for m in lark.messages():                    # delivery order
        if m.reply_to not in events:
            continue
        c, k = events[m.reply_to]
        found = TOKEN.search(m.text)
        assert found and (int(found[1]), int(found[2])) == (c, k), (m.text, c, k)
        seen.setdefault(c, []).append(k)
    out_of_order = {c: ks for c, ks in seen.items() if ks != list(range(per_conv))}
    assert not out_of_order, list(out_of_order.items())[:5]
    stats = dict(messages=total, send_s=round(sent_s, 1), answered_s=round(answered_s, 1),
                 max_ack_ms=int(max(ack_times) * 1000))
    print("load:", stats)
    return stats


def _jittered_echo(req: dict):
    """Echo the question. The first message of each conversation takes 1 s and the rest
    0-20 ms, so the next message arrives while the first is being answered: a bot that
    answered one chat's messages in parallel would answer them out of order."""
    text = last_user_text(req)
    found = TOKEN.search(text)
    delay = 1.0 if found and found[2] == "0" else (zlib.crc32(text.encode()) % 20) / 1000
    return Delay(delay, Text(f"echo: {text}"))


async def _subprocess_load(server, lark, model, *, conversations: int, per_conv: int) -> None:
    model.responder = _jittered_echo
    srv = server()
    await srv.start_ready()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as http:
        async def post(ev):
            return await post_event(http, srv.url, ev, timeout=15)

        await _drive(post, lark, conversations=conversations, per_conv=per_conv)
    code, _ = await srv.terminate()
    assert code == 0
    errors = srv.errors()
    assert not errors, errors[:5]


async def test_100_conversations_of_4_messages(server, lark, model):
    await _subprocess_load(server, lark, model, conversations=100, per_conv=4)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_500_conversations_of_4_messages(server, lark, model):
    await _subprocess_load(server, lark, model, conversations=500, per_conv=4)


async def test_a_slow_first_answer_holds_back_the_rest_of_its_chat_only(tmp_path, lark, model):
    """Per-conversation order, sharply: each chat's first answer takes 1 s and its next three
    messages arrive meanwhile. They must wait for it (and see it in their context) — while
    other chats are not held up. (Fewer chats than the dispatcher's concurrency limit, so a
    bot answering one chat's messages in parallel would always show it.)"""
    model.responder = _jittered_echo
    async with Harness(tmp_path, lark=lark, model=model) as h:
        async def post(ev):
            return (await h.post(ev))[0]

        stats = await _drive(post, lark, conversations=10, per_conv=4, concurrency=10)
        # Without waiting for each other: ten 1 s first answers took about 1 s in all, not 10.
        assert stats["answered_s"] < 6, stats
