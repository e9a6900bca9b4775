"""Two replicas in one process on one PostgreSQL database (DESIGN.md §7): two EthanApps with
their own ETHAN_REPLICA_ID, one fake Lark and one fake model shared, real signed webhook
requests to each replica's own port. What the user sees is read from the fake Lark.

- a replica that accepted an event and then stopped working (no heartbeat, nothing marked —
  what SIGKILL leaves) has it answered by the other once the lease expires, without a restart;
- a replica working a slow reply keeps it (the heartbeat renews its lease), and the other's
  start-up recovery does not take it: one model call, one reply;
- the same events delivered to both replicas: one reply each;
- one chat's messages spread over both replicas are answered in the order they were sent.

Multi-process runs (SIGKILL, three replicas, PostgreSQL restarts) are tests/replicas/.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import pytest

from tests.fakes.fake_anthropic import Delay, FakeAnthropic, default_responder, user_texts
from tests.fakes.fake_lark import FakeLark
from tests.fakes.lark_events import make_text_event
from tests.harness import Harness
from tests.reliability.support import deliveries_by_trigger

LEASE_S = 3.0                    # the least ETHAN_LEASE_SECONDS accepts


@pytest.fixture
async def pair(tmp_path, pg_cluster):
    """Replicas A and B on one fresh PostgreSQL database."""
    url = pg_cluster.new_database()
    lark, model = FakeLark(), FakeAnthropic()
    lark.start()
    model.start()
    replicas = [Harness(tmp_path / name, lark=lark, model=model, ethan_database_url=url,
                        ethan_replica_id=name, ethan_lease_seconds=LEASE_S) for name in ("A", "B")]
    try:
        for h in replicas:
            await h.__aenter__()
        yield replicas
    finally:
        for h in replicas:
            with contextlib.suppress(Exception):
                await h.__aexit__(None, None, None)
        model.stop()
        lark.stop()


def freeze(h: Harness) -> None:
    """The replica stops working without marking anything, as SIGKILL would leave it: no
    heartbeat, no poll, nothing more handled (its webhook still stores and acknowledges)."""
    app = h.app
    for task in list(app._background):
        task.cancel()
    app.dispatcher._closing = True
    for task in list(app.dispatcher._tasks):
        task.cancel()


def slow_for(words: dict[str, float], default: float = 0.0):
    """Chat answers echo the message, after a delay chosen by a word in it."""
    def responder(req: dict):
        said = (user_texts(req) or [""])[-1]
        delay = next((s for w, s in words.items() if w in said), default)
        return Delay(delay, default_responder(req)) if delay else default_responder(req)
    return responder


def model_calls_for(model: FakeAnthropic, word: str) -> int:
    return sum(1 for r in model.chat_requests() if word in ((user_texts(r.json) or [""])[-1]))


async def post(h: Harness, event: dict) -> int:
    status, _ = await h.post(event)
    return status


async def wait_for(predicate, timeout: float = 15.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.05)


async def test_an_event_acknowledged_by_a_dead_replica_is_answered_by_the_other(pair):
    a, b = pair
    freeze(a)
    event = make_text_event("left behind by A", chat_id="oc_p2p_dead", sender="ou_dora")
    mid = event["event"]["message"]["message_id"]
    assert await post(a, event) == 200               # acknowledged: stored, A's to answer
    row = await b.app.db.fetchone("SELECT owner, status FROM inbox WHERE message_id = ?", (mid,))
    assert (row["owner"], row["status"]) == ("A", "pending")
    # B's poll takes it over once A's leases lapse (no restart of anything).
    await wait_for(lambda: deliveries_by_trigger(a.lark)[mid] >= 1, what="B's answer")
    await b.idle()
    assert deliveries_by_trigger(a.lark)[mid] == 1
    assert model_calls_for(a.model, "left behind by A") == 1
    assert b.app.replicas.taken_over >= 1
    row = await b.app.db.fetchone("SELECT owner, status FROM inbox WHERE message_id = ?", (mid,))
    assert (row["owner"], row["status"]) == ("B", "done")


async def test_a_live_replica_keeps_its_slow_reply_and_a_restart_beside_it_takes_nothing(pair):
    a, b = pair
    a.model.responder = slow_for({"slow one": 4 * LEASE_S})
    event = make_text_event("the slow one", chat_id="oc_p2p_slow", sender="ou_sam")
    mid = event["event"]["message"]["message_id"]
    assert await post(a, event) == 200
    await wait_for(lambda: model_calls_for(a.model, "slow one") == 1, what="A's model call")
    await b.restart()                                 # B's start-up recovery beside A's work
    # A works on well past several leases: its heartbeat keeps the row and the conversation.
    await wait_for(lambda: deliveries_by_trigger(a.lark)[mid] >= 1, timeout=20, what="A's answer")
    await a.idle()
    await b.idle()
    assert model_calls_for(a.model, "slow one") == 1          # nobody else answered it too
    assert deliveries_by_trigger(a.lark)[mid] == 1
    assert b.app.replicas.taken_over == 0
    row = await a.app.db.fetchone("SELECT owner, attempts, status FROM inbox WHERE message_id = ?", (mid,))
    assert (row["owner"], row["attempts"], row["status"]) == ("A", 1, "done")


async def test_the_same_events_delivered_to_both_replicas_are_answered_once(pair):
    a, b = pair
    a.model.responder = slow_for({}, default=0.2)
    events = [make_text_event(f"dup {i}", chat_id=f"oc_p2p_dup{i % 2}", sender=f"ou_u{i % 2}")
              for i in range(6)]
    statuses = await asyncio.gather(*(post(h, e) for e in events for h in (a, b, a)))
    assert set(statuses) == {200}
    mids = [e["event"]["message"]["message_id"] for e in events]
    await wait_for(lambda: all(deliveries_by_trigger(a.lark)[m] >= 1 for m in mids), what="six answers")
    await a.idle()
    await b.idle()
    assert [deliveries_by_trigger(a.lark)[m] for m in mids] == [1] * 6
    assert [model_calls_for(a.model, f"dup {i}") for i in range(6)] == [1] * 6


def answers(lark: FakeLark) -> list[str]:
    """The messages answered, in the order the answers were delivered."""
    return [m.reply_to for m in lark.messages() if m.reply_to]


async def test_one_chat_spread_over_both_replicas_is_answered_in_order(pair):
    a, b = pair
    # The first answer is slow: while it runs, the next messages reach both replicas. Without
    # the conversation lease the other replica answers its messages before the first.
    a.model.responder = slow_for({"m0 ": 1.5}, default=0.05)
    events = [make_text_event(f"m{i} of the chat", chat_id="oc_p2p_order", sender="ou_olga")
              for i in range(8)]
    for i, event in enumerate(events):
        assert await post((a, b)[i % 2], event) == 200
    mids = [e["event"]["message"]["message_id"] for e in events]
    await wait_for(lambda: len(answers(a.lark)) >= 8, what="eight answers")
    await a.idle()
    await b.idle()
    answered = answers(a.lark)
    assert answered == mids
    assert collections.Counter(answered) == collections.Counter({m: 1 for m in mids})
    # Later messages to the other replica, once the first has released the conversation.
    more = [make_text_event(f"m{i} later", chat_id="oc_p2p_order", sender="ou_olga") for i in (8, 9)]
    for i, event in enumerate(more):
        assert await post((b, a)[i % 2], event) == 200
    await wait_for(lambda: len(answers(a.lark)) >= 10, what="ten answers")
    answered = answers(a.lark)
    assert answered == mids + [e["event"]["message"]["message_id"] for e in more]
