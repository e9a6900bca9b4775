"""Issue 45, N6: the parse pool (bot/media/parse_pool.py) is fair between senders, its queue bounded.

One member sends files that run to the parse time limit (tests/reliability/bombs.py: a PDF of
text-less pages, each its own stream, ~9 s to read, killed at the wall clock) from several
chats at once, as real signed, encrypted webhook events with the bytes at the fake Lark's
resource API. Before the fix her two jobs held both workers, and another member's small file
waited for one of them to be killed (a whole ETHAN_PARSE_TIMEOUT); her further jobs queued
without bound. Now one sender holds at most half the pool, a free worker goes to a sender with
nothing running before her queued jobs, and past ``queue_per_sender`` waiting jobs she is told
to send again. Bob's latency under her files is measured in bench/bench_parse.py (bench/README
§14), not asserted here.
"""

from __future__ import annotations

import asyncio
import time

from bot.media.parse_pool import ParseLimits
from tests.harness import Harness
from tests.reliability import bombs
from tests.reliability.test_file_bombs import (_answer_all, inbox_status, refused_line, reply_to,
                                               send_attachment)

BOB = dict(chat_id="oc_p2p_bob", sender="ou_bob")
CAROL = dict(chat_id="oc_p2p_carol", sender="ou_carol")


def alice(i: int) -> dict:
    """Alice in her i-th chat (each conversation is answered in order, so her parallel jobs
    come from parallel chats: p2p, groups, topics)."""
    return dict(chat_id=f"oc_alice_{i}", sender="ou_alice")


def _slow_pdf() -> bytes:
    return bombs.textless_pdf(pages=30, ops=15_000, shared=False)


async def _warm_both_workers(h) -> None:
    # Two senders at once: both workers are started before the attack (a worker's start-up
    # is not what is measured).
    evs = [await send_attachment(h, "warm.txt", b"warm up", chat=c) for c in (BOB, CAROL)]
    for ev in evs:
        await reply_to(h, ev)
    await h.idle()


async def _fetched(h, n: int, timeout: float = 10.0) -> None:
    """Until the bot has downloaded ``n`` resources (the files are then on their way into the pool)."""
    end = time.monotonic() + timeout
    while len(h.lark.calls_to("/resources/")) < n:
        assert time.monotonic() < end, "the files were never fetched"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)


def _sent_at(h, ev) -> float:
    mid = ev["event"]["message"]["message_id"]
    [m] = [m for m in h.lark.messages() if m.reply_to == mid]
    return h.lark.messages().index(m)


async def test_one_senders_bombs_from_two_chats_do_not_hold_another_senders_file(tmp_path, logs):
    """Alice's two slow PDFs from two chats, then Bob's small file: Bob's is read by the worker
    Alice may not take, and answered before either of hers (before: after her first was killed
    at the time limit); Alice's second waits behind her first, not beside it."""
    async with Harness(tmp_path, ethan_parse_timeout=4.0) as h:
        _answer_all(h)
        assert h.app.parse_pool.limits.workers == 2
        await _warm_both_workers(h)
        fetched = len(h.lark.calls_to("/resources/"))
        slow = _slow_pdf()
        t0 = time.perf_counter()
        bombs_sent = [await send_attachment(h, "slow.pdf", slow, chat=alice(i)) for i in (1, 2)]
        await _fetched(h, fetched + 2)
        t_bob = time.perf_counter()
        bob = await send_attachment(h, "notes.txt", "鲍勃的小文件".encode(), chat=BOB)
        await reply_to(h, bob, 30)
        bob_took = time.perf_counter() - t_bob
        assert not [m for m in h.lark.messages() if m.reply_to in
                    {ev["event"]["message"]["message_id"] for ev in bombs_sent}], \
            "one of Alice's bombs was answered before Bob's small file"
        answered = [await reply_to(h, ev, 40) for ev in bombs_sent]
        alice_took = time.perf_counter() - t0
        await h.idle(timeout=30)
        # Bob's file reached the model; Alice's two were each killed at the limit, one after the other.
        assert any("鲍勃的小文件" in h.model.last_user_text(r) for r in h.model.chat_requests())
        assert all("读不了" in m.text for m in answered), [m.text for m in answered]
        assert sorted(refused_line(logs, ev)["cause"] for ev in bombs_sent) == ["timeout", "timeout"]
        assert _sent_at(h, bob) < min(_sent_at(h, ev) for ev in bombs_sent)
        assert alice_took >= 2 * 4.0, alice_took          # serial behind her own, not two at once
        assert [await inbox_status(h, ev) for ev in (bob, *bombs_sent)] == ["done"] * 3
        print(f"Bob's file answered in {bob_took:.2f} s; Alice's two bombs in {alice_took:.2f} s")


async def test_a_sender_past_her_queue_is_told_to_send_again_and_others_are_not(tmp_path, logs):
    """Alice sends a slow PDF from 1 + queue_per_sender + 1 chats at once: one runs, four wait
    behind it, the last is refused at once with a short answer and one ``attachment.refused``
    line (reason ``busy``, cause ``sender_queue``, the ids); its row is finished. Bob's file is
    still read meanwhile; every one of Alice's waiting files is answered in the end (before: no
    bound, every file waited)."""
    queue = ParseLimits().queue_per_sender
    async with Harness(tmp_path, ethan_parse_timeout=1.5) as h:
        _answer_all(h)
        await _warm_both_workers(h)
        fetched = len(h.lark.calls_to("/resources/"))
        slow = _slow_pdf()
        sent = [await send_attachment(h, "slow.pdf", slow, chat=alice(i)) for i in range(queue + 2)]
        await _fetched(h, fetched + len(sent))
        # The first of her files answered is the refused one, at once (not one killed at the limit).
        by_mid = {e["event"]["message"]["message_id"]: e for e in sent}
        end = time.monotonic() + 30
        while not (first := [m for m in h.lark.messages() if m.reply_to in by_mid]):
            assert time.monotonic() < end, "none of Alice's files answered"
            await asyncio.sleep(0.02)
        reply = first[0]
        assert "还在读你之前发的文件" in reply.text, reply.text
        ev = by_mid[reply.reply_to]
        line = refused_line(logs, ev)
        assert (line["reason"], line["cause"], line["user_id"]) == ("busy", "sender_queue", "ou_alice"), line
        assert line["message_id"] == ev["event"]["message"]["message_id"]
        assert await inbox_status(h, ev) == "done"
        bob = await send_attachment(h, "notes.txt", "鲍勃的小文件".encode(), chat=BOB)
        await reply_to(h, bob, 10)
        waiting = [e for e in sent if e is not ev]
        assert not all([m for m in h.lark.messages() if m.reply_to == e["event"]["message"]["message_id"]]
                       for e in waiting), "Bob's file waited for all of Alice's"
        for e in waiting:
            assert "读不了" in (await reply_to(h, e, 60)).text
        await h.idle(timeout=30)
        # Exactly one refused for the queue; the others each read and killed at the limit.
        assert [refused_line(logs, e)["cause"] for e in waiting] == ["timeout"] * len(waiting)
        assert [await inbox_status(h, e) for e in sent] == ["done"] * len(sent)
        assert h.app.parse_pool.load() == (0, 0)


async def _load(h, want: tuple[int, int], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while h.app.parse_pool.load() != want:
        assert time.monotonic() < end, f"pool load {h.app.parse_pool.load()}, expected {want}"
        await asyncio.sleep(0.02)


async def test_a_recalled_file_waiting_in_the_queue_leaves_it(tmp_path, logs):
    """Alice's slow PDFs from 3 chats (one read, two waiting); she recalls the last: its answer
    is stopped while it waits and it leaves the queue (a cancelled wait left behind would be
    handed a worker later: InvalidStateError in another job's release). Her other two are
    answered, the books end at (0, 0), no job failed."""
    from tests.fakes.lark_events import make_recalled_event

    async with Harness(tmp_path, ethan_parse_timeout=6.0) as h:
        _answer_all(h)
        await _warm_both_workers(h)
        slow = _slow_pdf()
        sent = []
        for i in (1, 2, 3):                  # one at a time: the last one sent is a waiting one
            sent.append(await send_attachment(h, "slow.pdf", slow, chat=alice(i)))
            await _load(h, (1, i - 1))
        gone = sent[-1]["event"]["message"]
        status, _ = await h.post(make_recalled_event(gone["message_id"], chat_id=gone["chat_id"]))
        assert status == 200
        end = time.monotonic() + 5
        while not [e for e in logs.entries if e.get("event") == "reply.stopped_by_recall"]:
            assert time.monotonic() < end, "the recall did not stop the answer"
            await asyncio.sleep(0.02)
        # At once, not when her first file ends (a worker handed on would also drop the count):
        assert not [m for m in h.lark.messages() if m.reply_to in
                    {e["event"]["message"]["message_id"] for e in sent}]
        assert h.app.parse_pool.load() == (1, 1)
        for ev in sent[:2]:
            assert "读不了" in (await reply_to(h, ev, 40)).text
        await h.idle(timeout=30)
        assert h.app.parse_pool.load() == (0, 0)
        assert not [m for m in h.lark.messages() if m.reply_to == gone["message_id"]]
        assert [e["event"] for e in logs.entries if e.get("event") == "reply.stopped_by_recall"
                and e.get("message_id") == gone["message_id"]]
        assert not [e for e in logs.entries if e.get("event") in ("dispatch.job_failed", "reply.failed")]
