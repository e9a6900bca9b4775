"""Three ``ethan serve`` replicas on one PostgreSQL database (issue 16, "Done when"; DESIGN §7).

- events spread round robin over the replicas, and each event's duplicate delivered to every
  replica at once: one reply per message; each chat's replies in the order its messages were
  sent, each answered with the previous one in the model's context;
- one replica SIGKILLed mid-load: every message acknowledged with 200 (by any replica, the
  killed one included) is answered exactly once by the survivors, within a few leases, with
  no restart;
- a streaming card started by one replica and left half-written by its SIGKILL is finished
  by another: one visible reply, no second card.
"""

from __future__ import annotations

import asyncio
import collections
import re

import aiohttp

from tests.fakes.fake_anthropic import Text
from tests.fakes.lark_events import make_text_event
from tests.reliability.support import wait_for_progress, wait_until
from tests.replicas.conftest import echo
from tests.replicas.fleet import (LEASE_SECONDS, LarkSender, answered, assert_answered_once, mid, pg_rows,
                                  text_event)

REPLY = re.compile(r"^echo: (\S+) after (\S+)$")


def _diagnose(fleet) -> str:
    rows = pg_rows(fleet.database_url, "SELECT status, attempts, COUNT(*) FROM inbox GROUP BY status, attempts")
    return f"inbox (status, attempts, n): {rows}\n{fleet.tails()}"


async def test_duplicates_to_every_replica_one_reply_each_in_chat_order(fleet, lark, model):
    chats, per_chat = 6, 5
    model.latency = 0.05
    servers = await fleet.start(3)
    urls = [s.url for s in servers]
    sent: dict[int, list[dict]] = {c: [text_event(c, n) for n in range(per_chat)] for c in range(chats)}

    async with aiohttp.ClientSession() as http:
        lark_side = LarkSender(http)

        async def chat(c: int) -> None:
            # A chat's messages in order, each to the next replica (round robin over the
            # fleet, so the rows of one chat are stored by different replicas), then its
            # duplicate to every replica at once (Lark's redelivery, racing the answer).
            for n, ev in enumerate(sent[c]):
                await lark_side.deliver([urls[(c + n) % len(urls)]], ev)
                await lark_side.duplicate_to_all(urls, ev)
        await asyncio.gather(*(chat(c) for c in range(chats)))

    expected = {mid(ev) for evs in sent.values() for ev in evs}
    assert set(lark_side.acked) == expected
    assert not {500, 503} & set(lark_side.statuses), collections.Counter(lark_side.statuses)
    await wait_for_progress(lambda: answered(lark, expected), len(expected), stall=4 * LEASE_SECONDS + 10,
                            what="every message answered", diagnose=lambda: _diagnose(fleet))
    await asyncio.sleep(LEASE_SECONDS)       # a second answer (another replica's) would be out by now
    assert_answered_once(lark, expected)

    token_of = {mid(ev): f"m-c{c:02d}-n{n:03d}" for c, evs in sent.items() for n, ev in enumerate(evs)}
    for c, evs in sent.items():
        mine = {mid(ev) for ev in evs}
        replies = [m for m in lark.messages() if m.reply_to in mine]     # in delivery order
        got = [REPLY.match(m.text).groups() for m in replies]
        want = [(token_of[mid(ev)], token_of[mid(evs[n - 1])] if n else "-") for n, ev in enumerate(evs)]
        assert got == want, f"chat {c}: replies (answered, after) out of order:\n{got}\nwanted\n{want}"
    # The load was spread: it was not one replica doing all the work.
    replied = {s.extra_env["ETHAN_REPLICA_ID"]: sum(e.get("event") == "agent.replied" for e in s.entries())
               for s in servers}
    assert sum(n > 0 for n in replied.values()) >= 2, replied
    for srv in servers:
        code, _ = await srv.terminate()
        assert code == 0, srv.tail()
    assert not fleet.errors(), fleet.errors()


async def test_a_replica_killed_mid_load_leaves_its_work_to_the_others(fleet, lark, model):
    chats, per_chat = 12, 4
    model.latency = 0.4                       # so the victim holds acknowledged, unanswered work
    servers = await fleet.start(3)
    victim = servers[0]
    events = [text_event(c, n, tag="k") for n in range(per_chat) for c in range(chats)]
    expected = {mid(ev) for ev in events}

    def live_urls() -> list[str]:
        return [s.url for s in fleet.alive()]

    async with aiohttp.ClientSession() as http:
        lark_side = LarkSender(http, retry_after=0.2)
        # Round robin (the first delivery of event i goes to replica i % 3; a retry, to the
        # next live one), one event every 50 ms.
        stream = asyncio.gather(*(lark_side.deliver(
            lambda i=i: [u for u in ([s.url for s in servers][i % 3:] + [s.url for s in servers][:i % 3])
                         if u in live_urls()],
            ev, after=i * 0.05) for i, ev in enumerate(events)))
        await wait_until(lambda: sum(u == victim.url for u in lark_side.acked.values()) >= 6, 30,
                         "the victim to acknowledge some events")
        victim.kill()
        # What the victim sent before it died is in the sockets already: let the fake Lark read
        # it before deciding what was left (a reply sent just before its agent.replied line was
        # written is the victim's answer, not left-over work). A take-over waits for the lease.
        await asyncio.sleep(0.3)
        acked_by_victim = {m for m, u in lark_side.acked.items() if u == victim.url}
        unanswered_at_kill = acked_by_victim - set(answered_set(lark))
        await stream

    assert 500 not in lark_side.statuses
    assert set(lark_side.acked) == expected
    assert unanswered_at_kill, "the victim had answered everything it acknowledged: nothing was left over"
    await wait_for_progress(lambda: answered(lark, expected), len(expected), stall=4 * LEASE_SECONDS + 10,
                            what="every acknowledged message answered", diagnose=lambda: _diagnose(fleet))
    await asyncio.sleep(LEASE_SECONDS)
    assert_answered_once(lark, expected)
    survivors = servers[1:]
    left = unanswered_at_kill - answered_in_logs(servers)
    assert not left, f"left by the victim and answered by no replica's log: {sorted(left)[:5]}"
    for srv in survivors:
        code, _ = await srv.terminate()
        assert code == 0, srv.tail()
    assert not fleet.errors(), fleet.errors()
    print(f"victim acknowledged {len(acked_by_victim)}, {len(unanswered_at_kill)} unanswered at the kill")


def answered_set(lark) -> set[str]:
    return {m.reply_to for m in lark.messages() if m.reply_to}


def answered_in_logs(servers) -> set[str]:
    """The messages these replicas' logs say they answered: by asking the model, or by sending
    again an answer already stored (agent.replayed: a survivor taking over what a killed replica
    had committed but not sent; same uuid, so Lark shows it once). A killed replica's reply may
    reach Lark after the test read the fake's records."""
    return {e.get("message_id") for s in servers for e in s.entries()
            if e.get("event") in ("agent.replied", "agent.replayed")}


async def test_a_card_left_by_a_killed_replica_is_finished_by_another(fleet, lark, model):
    answer = "".join(f"第 {i} 段：这是一个很长的回答，用来测试副本崩溃时的流式卡片。\n" for i in range(60))
    model.responder = lambda req: Text(answer)
    model.stream_chunks = 30
    model.stream_delay = 0.25                 # ~8 s of streaming
    servers = await fleet.start(2)
    first, other = servers
    ev = make_text_event("写一篇长文", chat_id="oc_p2p_card", sender="ou_card")
    async with aiohttp.ClientSession() as http:
        assert await LarkSender(http).deliver([first.url], ev) == first.url
    await wait_until(lambda: any(m.card_id for m in lark.messages()), 20, "the streaming card")
    first.kill()
    model.stream_delay = 0.0
    await wait_until(lambda: any(lark.card(m.card_id).streaming_mode is False
                                 for m in lark.messages() if m.card_id), 6 * LEASE_SECONDS + 20,
                     "the card finished by the other replica")
    await asyncio.sleep(LEASE_SECONDS)
    visible = [m for m in lark.messages() if m.reply_to == mid(ev)]
    assert len(visible) == 1, [(m.message_id, m.msg_type, m.card_id, m.text[:40]) for m in visible]
    assert visible[0].text.strip().endswith(answer.strip()[-20:])
    assert any(e.get("event") == "agent.replied" for e in other.entries()), other.tail()
    code, _ = await other.terminate()
    assert code == 0, other.tail()
    assert not fleet.errors(), fleet.errors()
    model.responder = echo
