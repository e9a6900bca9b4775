"""The scheduler with an injected clock over the real store (bot/schedules/scheduler.py): past the grace
window an occurrence is skipped and recorded, not sent; a chat the bot left stops the job once;
a Lark refusal of the chat stops it; a send that fails transiently keeps the claim (retried
after the lease, same uuid)."""

from __future__ import annotations

from bot.schedules.scheduler import LarkDelivery, Scheduler, Undeliverable, occurrence_uuid
from memory.schedules.store import ScheduleStore

T0 = 1_900_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def _job(store, **kw):
    args = dict(owner_id="ou_a", chat_id="oc_a", chat_type="p2p", text="call", tz="UTC",
                dtstart="2030-03-17T18:00")   # T0 + 20 min, UTC
    args.update(kw)
    return await store.add(**args)


async def test_past_the_grace_window_it_is_skipped_and_recorded(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock)
    job = await _job(store, rrule="FREQ=DAILY")
    sent = []

    async def deliver(j, text, uuid):
        sent.append(uuid)
        return "om_1"

    s = Scheduler(store, deliver, clock=clock, grace_s=3600)
    clock.t = job.next_due + 3 * 86400 + 7200          # three days and two hours late
    assert await s.tick() == 1
    await s.idle()
    assert sent == []
    [d] = await store.deliveries(job.id)
    assert d.status == "skipped"
    assert (await store.get(job.id)).next_due == job.next_due + 4 * 86400   # on with the next one
    clock.t = job.next_due + 4 * 86400
    await s.tick()
    await s.idle()
    assert sent == [occurrence_uuid(job.id, job.next_due + 4 * 86400)]


async def test_a_chat_the_bot_left_stops_the_job_once(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock)
    job = await _job(store, rrule="FREQ=DAILY")
    await db.execute("INSERT INTO chats_left(chat_id, at) VALUES (?, ?)", ("oc_a", T0))
    s = Scheduler(store, LarkDelivery(None, db), clock=clock)
    clock.t = job.next_due
    await s.tick()
    await s.idle()
    after = await store.get(job.id)
    assert after.state == "stopped" and "removed" in after.note
    [d] = await store.deliveries(job.id)
    assert d.status == "failed"
    clock.t += 86400
    assert await s.tick() == 0                               # never retried


async def test_a_transient_failure_keeps_the_claim_and_retries_with_the_same_uuid(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock, lease_seconds=60)
    job = await _job(store)
    uuids, fail = [], [True]

    async def deliver(j, text, uuid):
        uuids.append(uuid)
        if fail[0]:
            raise ConnectionError("Lark down")
        return "om_2"

    s = Scheduler(store, deliver, clock=clock)
    clock.t = job.next_due
    await s.tick()
    await s.idle()
    assert await s.tick() == 0                               # still claimed: not retried at once
    clock.t += 61
    fail[0] = False
    await s.tick()
    await s.idle()
    assert uuids == [occurrence_uuid(job.id, job.next_due)] * 2
    assert [d.status for d in await store.deliveries(job.id)] == ["late"]   # held up past a minute
    assert (await store.get(job.id)).state == "done"


async def test_undeliverable_from_the_deliverer_stops(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock)
    job = await _job(store)

    async def deliver(j, text, uuid):
        raise Undeliverable("Lark refused the chat: code 230002 (permission)")

    s = Scheduler(store, deliver, clock=clock)
    clock.t = job.next_due
    await s.tick()
    await s.idle()
    assert (await store.get(job.id)).state == "stopped"


async def test_a_group_reminder_mentions_its_owner_and_nobody_else(db):
    """At the wire (the real OpenApi client against the fake Lark): the stored text's own
    <at> tags — written by a user or the model — reach Lark inert; the owner's mention is real."""
    from bot.lark.openapi.client import OpenApi
    from bot.lark.outbound.sender import LarkSender
    from tests.fakes.fake_lark import FakeLark

    lark = FakeLark()
    lark.start()
    api = OpenApi("cli_test", "secret", lark.base_url, timeout=5)
    try:
        clock = Clock(T0)
        store = ScheduleStore(db, clock=clock)
        job = await _job(store, chat_id="oc_team", chat_type="group",
                         text='周报 <at user_id="all"></at> <at id=ou_b></at>')
        s = Scheduler(store, LarkDelivery(LarkSender(api), db), clock=clock)
        clock.t = job.next_due
        await s.tick()
        await s.idle()
        [call] = [c for c in lark.calls_to("/im/v1/messages", "POST") if "receive_id_type" in c.query]
        text = __import__("json").loads(call.json["content"])["text"]
        assert '<at user_id="ou_a"></at>' in text
        assert '<at user_id="all">' not in text and "<at id=ou_b>" not in text
    finally:
        await api.aclose()
        lark.stop()
