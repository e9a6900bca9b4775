"""Replicas' leases in the stores (bot/delivery/inbox_store.py, memory/working/consolidation_queue.py), on SQLite
and PostgreSQL: who may claim an inbox row, a conversation, a consolidation job; expiry;
heartbeat renewal; and that of many concurrent claimers exactly one wins."""

from __future__ import annotations

import asyncio

import anthropic
import pytest

from bot.llm.anthropic_model import AnthropicChatModel
from memory.working.consolidation_queue import ConsolidationQueue, JobClaims
from memory.working.consolidator import EXTRACT_TOOL, SUMMARY_TOOL, Consolidator
from storage import database
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from bot.delivery.inbox_store import Inbox
from memory.profile.modes import ModeStore
from memory.models import route_consolidation_model
from memory.profile.store import ProfileStore
from memory.scope import Scope
from memory.sessions.store import SessionStore
from memory.working.view import MemoryConfig, WorkingMemory
from tests.fakes.fake_anthropic import Delay, FakeAnthropic, ToolUse
from tests.memory.test_consolidation_queue import consolidation_calls, extract_answer, summary_answer


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _event(i: int, conv: str = "oc_a") -> dict:
    return dict(event_id=f"ev_{i}", message_id=f"om_{i}", chat_id=conv, conv_key=conv,
                create_time=1_800_000_000.0 + i, payload=f'{{"i": {i}}}')


async def _owner(db, item_id: int):
    row = await db.fetchone("SELECT owner, lease_until, attempts FROM inbox WHERE id = ?", (item_id,))
    return row["owner"], row["lease_until"], row["attempts"]


async def test_a_row_is_claimed_only_when_unowned_own_or_expired(db):
    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock, conversations=True)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock, conversations=True)
    item = await a.accept(**_event(1))
    assert item.held and (await _owner(db, item.id))[:2] == ("A", clock.t + 10)
    assert not await b.start(item.id)                  # A is alive: B may not
    assert await a.start(item.id)                      # its own
    clock.t += 9
    assert not await b.start(item.id)                  # not expired yet (A's start renewed it)
    clock.t += 2
    assert await b.start(item.id)                      # expired: B takes it over
    assert await _owner(db, item.id) == ("B", clock.t + 10, 2)
    assert not await a.start(item.id)                  # and now A may not
    await b.leave(item.id)
    assert (await _owner(db, item.id))[0] is None
    assert await a.start(item.id)                      # unowned: anyone
    await a.finish(item.id, "done")
    assert not await a.start(item.id) and not await b.start(item.id)   # no longer pending


async def test_the_heartbeat_renews_rows_and_conversations_and_keeps_others_out(db):
    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock, conversations=True)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock, conversations=True)
    item = await a.accept(**_event(1))
    for _ in range(5):                                 # 5 × 6 s: long past one lease
        clock.t += 6
        assert await a.renew() == {"oc_a"}
        assert not await b.start(item.id)
        assert not await b.hold("oc_a")
        assert await b.orphans() == []
    clock.t += 11                                      # the heartbeat stopped (A died)
    assert [i.id for i in await b.orphans()] == [item.id]
    assert await b.hold("oc_a") and await b.start(item.id)
    assert await a.renew() == set()                    # A learns it lost the conversation


async def test_an_event_for_a_conversation_held_elsewhere_is_stored_unowned_for_the_holder(db):
    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock, conversations=True)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock, conversations=True)
    first = await a.accept(**_event(1))
    second = await b.accept(**_event(2))               # B received the next message
    other = await b.accept(**_event(3, conv="oc_b"))   # another conversation: B's
    assert first.held and not second.held and other.held
    assert (await _owner(db, second.id))[0] is None
    # the holder finds it (older-than and all), nobody else's poll does while A holds oc_a
    assert [i.id for i in await a.claimable("oc_a")] == [second.id]
    assert [i.id for i in await a.claimable("oc_a", before=second.id)] == []
    assert second.id not in [i.id for i in await b.orphans()]
    assert await a.start(second.id)
    # released with the row still pending: the poll of any replica sees it
    await a.leave(second.id)
    await a.release("oc_a")
    assert [i.id for i in await b.orphans()] == [second.id]       # first: still A's own row


async def test_conversation_leases_follow_the_same_rule(db):
    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock)
    assert await a.hold("oc_x") and await a.hold("oc_x")
    assert not await b.hold("oc_x")
    clock.t += 10.5
    assert await b.hold("oc_x") and not await a.hold("oc_x")
    await a.release("oc_x")                            # not A's any more: untouched
    assert not await a.hold("oc_x")
    await b.release("oc_x")
    assert await a.hold("oc_x")
    await a.release_all()
    assert await b.hold("oc_x")


async def test_of_many_concurrent_claimers_one_wins(db_target):
    """Two replicas' own connections (two pools / two SQLite connections), 20 claims each at
    once, for one conversation, one row and one consolidation job: one winner each."""
    d1, d2 = await database(db_target).open(), await database(db_target).open()
    try:
        a, b = Inbox(d1, owner="A"), Inbox(d2, owner="B")
        item = await a.accept(**_event(1))
        await a.leave(item.id)
        holds = await asyncio.gather(*(x.hold("oc_race") for _ in range(20) for x in (a, b)))
        winners = {x.owner for x, won in zip([a, b] * 20, holds) if won}
        assert len(winners) == 1
        starts = await asyncio.gather(*(x.start(item.id) for _ in range(20) for x in (a, b)))
        assert len({x.owner for x, won in zip([a, b] * 20, starts) if won}) == 1
        ja, jb = JobClaims(d1, "A"), JobClaims(d2, "B")
        claims = await asyncio.gather(*(x.claim("s1") for _ in range(20) for x in (ja, jb)))
        assert len({x.owner for x, won in zip([ja, jb] * 20, claims) if won}) == 1
    finally:
        await d1.close()
        await d2.close()


async def test_a_consolidation_claim_excludes_others_until_released_or_expired(db):
    clock = Clock()
    a = JobClaims(db, "A", lease_seconds=10, clock=clock)
    b = JobClaims(db, "B", lease_seconds=10, clock=clock)
    assert await a.claim("s1") and await a.claim("s1")
    assert not await b.claim("s1")
    assert await b.claim("s2")                          # per session
    clock.t += 8
    assert await a.renew() == 1
    clock.t += 8
    assert not await b.claim("s1")                      # renewed
    clock.t += 3
    assert await b.claim("s1")                          # expired: the claimer died
    assert not await a.claim("s1")
    await b.release("s1")
    assert await a.claim("s1")


# -- two consolidation queues (two replicas) on one database -------------------------------

class Worker:
    def __init__(self, target, fake: FakeAnthropic, owner: str, config: MemoryConfig) -> None:
        self.target, self.fake, self.owner, self.config = target, fake, owner, config

    async def open(self) -> "Worker":
        self.db = await database(self.target).open()
        self.sessions = SessionStore(self.db)
        self.working = WorkingMemory(self.db, self.sessions, self.config)
        self.client = anthropic.AsyncAnthropic(base_url=self.fake.base_url, api_key="test", max_retries=0)
        consolidator = Consolidator(AnthropicChatModel(self.client, route_consolidation_model("claude-sonnet-4-6")),
                                    timeout=10)
        self.queue = ConsolidationQueue(
            db=self.db, sessions=self.sessions, working=self.working, facts=FactStore(self.db),
            profile=ProfileStore(self.db), episodes=EpisodeStore(self.db), modes=ModeStore(self.db),
            consolidator=consolidator, owner=self.owner, claim_seconds=30, backoff_base=0.0)
        await self.queue.start()
        return self

    async def close(self) -> None:
        await self.queue.drain(5)
        await self.client.close()
        await self.db.close()


async def test_two_workers_never_consolidate_one_session_at_once(db_target):
    """Both replicas are asked for the same session's due compression at the same moment; the
    model is slow, so without the claim both would call it (and one would find its work stale
    afterwards). With it, one compresses, the other sees the claim and leaves it."""
    config = MemoryConfig(hot_size=3, compress_batch=2, warm_capacity=100)
    with FakeAnthropic() as fake:
        fake.on_tool(SUMMARY_TOOL, lambda req: Delay(0.6, ToolUse(SUMMARY_TOOL, summary_answer(req))), keys={"summary"})
        fake.on_tool(EXTRACT_TOOL, extract_answer, keys={"facts", "profile_psych"})
        a = await Worker(db_target, fake, "A", config).open()
        b = await Worker(db_target, fake, "B", config).open()
        try:
            scope = Scope(user_id="ou_alice", chat_id="oc_p2p", chat_type="p2p")
            sid = ""
            for i in range(1, 6):           # 5 turns: hot 3 + batch 2 -> one compression due
                res = await a.sessions.append_user(scope, f"q{i}", sender_name="Alice")
                sid = res.session.id
                await a.sessions.append_assistant(sid, f"a{i}")
            assert (await a.queue.store.due(sid)) is not None
            a.queue.request(sid)
            b.queue.request(sid)
            await asyncio.gather(a.queue.wait_idle(10), b.queue.wait_idle(10))
            assert len(consolidation_calls(fake, "compress")) == 1
            counts = {w.owner: w.queue.stats() for w in (a, b)}
            assert sum(c.get("claimed_elsewhere", 0) for c in counts.values()) >= 1, counts
            assert sum(c.get("stale", 0) for c in counts.values()) == 0, counts
            assert (await a.queue.store.due(sid)) is None
            rows = await a.db.fetchall("SELECT COUNT(*) AS n FROM consolidation_claims")
            assert rows[0]["n"] == 0                    # released at the end of the job
        finally:
            await a.close()
            await b.close()


async def test_the_holder_answers_what_was_left_before_it_releases_in_one_step(db):
    """No release race: the look for left rows and the release are one transaction, so a row
    stored for the conversation is either found by the holder or stored by a new holder."""
    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock, conversations=True)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock, conversations=True)
    first = await a.accept(**_event(1))
    left = await b.accept(**_event(2))
    assert not left.held
    assert [i.id for i in await a.release_or_next("oc_a")] == [left.id]   # kept: work left
    assert not await b.hold("oc_a")
    for item in (first, left):
        assert await a.start(item.id)
        await a.finish(item.id, "done")
    from tests.round_trips import counting_round_trips
    with counting_round_trips(db) as trips:
        assert await a.release_or_next("oc_a") == []                      # released
    # the lease locked (with BEGIN), released unless rows are left (one statement), COMMIT
    assert trips["n"] == (1 if db.dialect == "sqlite" else 3), trips
    third = await b.accept(**_event(3))
    assert third.held and (await _owner(db, third.id))[0] == "B"


async def test_why_a_row_was_not_claimed(db):
    """The handler logs a refused claim by its cause: only a recall counts as "recalled"
    (another replica's row is not a recalled message)."""
    from memory.governance.withdraw import cancel_pending

    clock = Clock()
    a = Inbox(db, owner="A", lease_seconds=10, clock=clock, conversations=True)
    b = Inbox(db, owner="B", lease_seconds=10, clock=clock, conversations=True)
    owned = await a.accept(**_event(1))
    assert not await b.start(owned.id) and await b.why_unclaimed(owned.id) == "owned"
    await a.finish(owned.id, "done")
    assert not await b.start(owned.id) and await b.why_unclaimed(owned.id) == "finished"
    recalled = await a.accept(**_event(2, conv="oc_b"))
    assert await cancel_pending(db, "om_2") == 1
    assert not await a.start(recalled.id) and await a.why_unclaimed(recalled.id) == "recalled"
    assert await a.why_unclaimed(10_000) == "gone"


# -- whose clock, and one process per replica id (issue 32 M6) ----------------------------

async def test_the_lease_clock_is_the_databases_whatever_the_local_clock_says(db):
    """A process whose clock is 40 s ahead reads the database's time: its leases and the
    expiry it sees agree with every other replica's."""
    import time

    from memory.leases import DatabaseClock, database_now

    honest, ahead = DatabaseClock(), DatabaseClock(local=lambda: time.time() + 40.0)
    await honest.sync(db)
    await ahead.sync(db)
    assert abs(ahead.offset + 40.0) < 1.0, ahead.offset
    assert abs(ahead() - honest()) < 1.0
    assert abs(await db.read(database_now) - honest()) < 1.0


async def test_a_replica_id_is_held_by_one_process_until_its_lease_runs_out(db):
    clock = Clock()
    first = Inbox(db, owner="replica-0", lease_seconds=10, clock=clock, conversations=True)
    twin = Inbox(db, owner="replica-0", lease_seconds=10, clock=clock, conversations=True)
    assert (await first.hold_identity()) == (True, clock.t + 10)
    assert (await twin.hold_identity()) == (False, clock.t + 10)
    assert await first.hold_identity() == (True, clock.t + 10)    # its own: renewed
    clock.t += 6
    await first.renew()                                            # the live one's heartbeat
    assert (await twin.hold_identity()) == (False, clock.t + 10)   # later than first seen: alive
    # The id's lease is not a conversation: renew() reports only conversations held.
    assert await first.renew() == set()
    clock.t += 11                                                  # the first died: no heartbeat
    assert (await twin.hold_identity())[0]
    # A clean stop hands the id back at once.
    await twin.release_all()
    assert (await first.hold_identity())[0]
