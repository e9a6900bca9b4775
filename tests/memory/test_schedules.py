"""The schedule store's contract on SQLite and PostgreSQL (memory/schedules/store.py): scoping,
limits, claims with leases, one record per occurrence, recurrence in the owner's zone, erase."""

from __future__ import annotations

import asyncio
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from storage import database
from memory.governance.erase import delete_session, erase_user, forget_memory
from memory.schedules.recurrence import RecurrenceError, check_rrule, next_after, occurrences
from memory.schedules.store import ScheduleStore, TooManySchedules
from tests.loop_gaps import loop_gaps


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


T0 = datetime(2026, 3, 20, 8, 0, tzinfo=ZoneInfo("Europe/Berlin")).timestamp()   # a Friday


def _add(store, **kw):
    args = dict(owner_id="ou_a", chat_id="oc_a", chat_type="p2p", text="call the client",
                tz="Europe/Berlin", dtstart="2026-03-20T09:00")
    args.update(kw)
    return store.add(**args)


async def test_a_job_is_stored_due_at_its_local_time_and_scoped_to_its_owner(db):
    store = ScheduleStore(db, clock=Clock(T0), owner="A")
    job = await _add(store)
    assert job.next_due == T0 + 3600 and job.state == "active"
    assert [j.id for j in await store.for_owner("ou_a")] == [job.id]
    assert await store.for_owner("ou_b") == []
    assert not await store.cancel(job.id, owner_id="ou_b")          # someone else's: refused in SQL
    assert [j.id for j in await store.for_chat("oc_a")] == [job.id]
    assert await store.cancel(job.id, owner_id="ou_a")
    assert (await store.get(job.id)).state == "cancelled"
    assert not await store.cancel(job.id, owner_id="ou_a")          # once
    with pytest.raises(ValueError):
        await store.cancel(job.id)                                  # never unscoped


async def test_the_limit_per_user_is_counted_in_the_write(db):
    store = ScheduleStore(db, clock=Clock(T0), owner="A")
    results = await asyncio.gather(*(_add(store, text=f"r{i}", max_active=3) for i in range(6)),
                                   return_exceptions=True)
    assert sum(isinstance(r, TooManySchedules) for r in results) == 3
    assert await store.count_active("ou_a") == 3
    assert await store.count_active("ou_b") == 0


async def test_a_due_job_is_claimed_once_and_its_occurrence_recorded_once(db):
    clock = Clock(T0)
    a = ScheduleStore(db, clock=clock, owner="A", lease_seconds=30)
    b = ScheduleStore(db, clock=clock, owner="B", lease_seconds=30)
    job = await _add(a)
    assert await a.claim_due() == []                     # not due yet
    assert await a.next_due_time() == job.next_due
    clock.t = job.next_due
    got_a, got_b = await asyncio.gather(a.claim_due(), b.claim_due())
    assert len(got_a) + len(got_b) == 1                  # exactly one claimer
    holder, other = (a, b) if got_a else (b, a)
    claimed = (got_a or got_b)[0]
    assert await other.claim_due() == []                 # held: not claimable
    clock.t += 31                                        # the holder died: its lease ran out
    [taken] = await other.claim_due()
    assert not await holder.finish(claimed, claimed.next_due, "sent")   # lost the claim: nothing recorded
    assert await other.finish(taken, taken.next_due, "late", detail="due 09:00")
    assert not await other.finish(taken, taken.next_due, "late")        # once
    done = await a.get(job.id)
    assert done.state == "done" and done.next_due is None and done.claim_owner is None
    [d] = await a.deliveries(job.id)
    assert (d.status, d.due_at, d.detail) == ("late", job.next_due, "due 09:00")
    assert await a.next_due_time() is None


async def test_many_claimers_on_many_jobs_take_each_once(db):
    clock = Clock(T0)
    stores = [ScheduleStore(db, clock=clock, owner=f"R{i}") for i in range(4)]
    for i in range(40):
        await _add(stores[0], owner_id=f"ou_{i}", dtstart="2026-03-20T08:00")
    got = await asyncio.gather(*(s.claim_due(limit=7) for s in stores for _ in range(3)))
    ids = [j.id for batch in got for j in batch]
    assert len(ids) == len(set(ids)) == 40


async def test_a_recurring_job_advances_in_its_zone_and_a_released_claim_is_retried(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock, owner="A")
    job = await _add(store, chat_type="group", dtstart="2026-03-23T10:00", rrule="FREQ=WEEKLY;BYDAY=MO")
    clock.t = job.next_due
    [c] = await store.claim_due()
    await store.release(c.id)                            # a transient failure: given back
    [c] = await store.claim_due()
    assert await store.finish(c, c.next_due, "sent", lark_message_id="om_1")
    nxt = (await store.get(job.id)).next_due
    local = datetime.fromtimestamp(nxt, ZoneInfo("Europe/Berlin"))
    assert (local.weekday(), local.hour, local.minute) == (0, 10, 0)     # Monday 10:00 after the DST change
    assert nxt - c.next_due == 7 * 86400 - 3600                          # a 167-hour week


async def test_a_long_outage_skips_to_the_next_occurrence_with_one_record(db):
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock, owner="A")
    job = await _add(store, dtstart="2026-03-20T09:00", rrule="FREQ=DAILY")
    clock.t = job.next_due + 5 * 86400 + 60              # down for five days
    [c] = await store.claim_due()
    assert await store.finish(c, c.next_due, "skipped", skip_until=clock.t)
    [d] = await store.deliveries(job.id)
    assert d.status == "skipped" and "5 later" in d.detail
    assert (await store.get(job.id)).next_due == job.next_due + 6 * 86400
    assert [j.id for j, _ in await store.missed("ou_a", since=0)] == [job.id]
    assert await store.missed("ou_b", since=0) == []


async def test_a_chat_the_bot_left_stops_its_jobs(db):
    store = ScheduleStore(db, clock=Clock(T0), owner="A")
    job = await _add(store, chat_id="oc_g", chat_type="group")
    other = await _add(store, chat_id="oc_h", chat_type="group")
    assert await store.stop_chat("oc_g", "bot removed from the chat") == 1
    assert (await store.get(job.id)).state == "stopped"
    assert (await store.get(other.id)).state == "active"
    clock_due = Clock(other.next_due)
    store.clock = clock_due
    assert [j.id for j in await store.claim_due()] == [other.id]


async def test_erase_forget_and_session_deletion_remove_the_jobs(db):
    store = ScheduleStore(db, clock=Clock(T0), owner="A")
    await _add(store, owner_id="ou_a")
    await _add(store, owner_id="ou_b")
    c = (await forget_memory(db, "ou_a")).counts
    assert c["schedules"] == 1 and await store.for_owner("ou_a", active_only=False) == []
    job = await _add(store, owner_id="ou_b")
    clock = Clock(job.next_due)
    store.clock = clock
    for j in await store.claim_due():
        await store.finish(j, j.next_due, "sent")
    c = (await erase_user(db, "ou_b")).counts
    assert c["schedules"] == 2 and await store.for_owner("ou_b", active_only=False) == []
    assert (await db.fetchone("SELECT COUNT(*) FROM schedule_deliveries"))[0] == 0   # history went with them


async def test_session_deletion_removes_the_jobs_set_in_it(db):
    from memory.scope import Scope
    from memory.sessions.store import SessionStore
    sessions = SessionStore(db)
    scope = Scope(user_id="ou_a", chat_id="oc_a", chat_type="p2p")
    await sessions.append_user(scope, "remind me at nine")
    s = await sessions.active(scope.conv_key)
    store = ScheduleStore(db, clock=Clock(T0), owner="A")
    await _add(store, session_id=s.id)
    await _add(store, session_id="other")
    c = await delete_session(db, s.id)
    assert c["schedules"] == 1
    assert [j.session_id for j in await store.for_owner("ou_a")] == ["other"]


def test_recurrence_dst_month_ends_and_bad_rules():
    berlin = "Europe/Berlin"
    start = datetime(2026, 3, 1, tzinfo=ZoneInfo(berlin)).timestamp()
    end = datetime(2026, 4, 30, tzinfo=ZoneInfo(berlin)).timestamp()
    mondays = [datetime.fromtimestamp(t, ZoneInfo(berlin)) for t in
               occurrences("2026-03-02T10:00", berlin, "FREQ=WEEKLY;BYDAY=MO", start, end)]
    assert all((d.weekday(), d.hour) == (0, 10) for d in mondays) and len(mondays) == 9
    # New York changes on a different Sunday: 10:00 local each Monday there too
    ny = [datetime.fromtimestamp(t, ZoneInfo("America/New_York")) for t in
          occurrences("2026-03-02T10:00", "America/New_York", "FREQ=WEEKLY;BYDAY=MO", start, end)]
    assert {(d.weekday(), d.hour) for d in ny} == {(0, 10)}
    month_ends = [datetime.fromtimestamp(t, ZoneInfo("Asia/Shanghai")).day for t in
                  occurrences("2026-01-31T09:00", "Asia/Shanghai", "FREQ=MONTHLY;BYMONTHDAY=-1", 0, 1.8e9 + 4e7)]
    assert month_ends[:4] == [31, 28, 31, 30]
    assert next_after("2026-03-20T09:00", berlin, "", T0) == T0 + 3600
    assert next_after("2026-03-20T09:00", berlin, "", T0 + 7200) is None
    assert check_rrule("RRULE:FREQ=DAILY") == "FREQ=DAILY"
    for bad in ("FREQ=SOMETIMES", "DTSTART:20260101T000000\nRRULE:FREQ=DAILY", "BYDAY=XX"):
        with pytest.raises(RecurrenceError):
            check_rrule(bad)


# -- issue 45 N1: bounded walks --------------------------------------------------------------

def test_the_bounded_walk_gives_dateutils_occurrences():
    """The walk runs in a frame shifted by whole years with the same calendar: it must give
    exactly what dateutil gives in the real one (ISO weeks, month ends, 29 February, DST,
    UNTIL, COUNT, BYSETPOS)."""
    from dateutil.rrule import rrulestr

    rules = ["FREQ=WEEKLY;BYDAY=MO", "FREQ=MONTHLY;BYMONTHDAY=-1", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29",
             "FREQ=YEARLY;BYWEEKNO=53;BYDAY=SU", "FREQ=YEARLY;BYWEEKNO=1;BYDAY=MO", "FREQ=MONTHLY;BYDAY=-1FR",
             "FREQ=MONTHLY;BYSETPOS=-1;BYDAY=MO,TU,WE,TH,FR", "FREQ=DAILY;UNTIL=20270301T000000Z",
             "FREQ=DAILY;COUNT=40", "FREQ=HOURLY;INTERVAL=5", "FREQ=MINUTELY;INTERVAL=90",
             "FREQ=YEARLY;BYYEARDAY=366", "FREQ=YEARLY;BYMONTH=3;BYDAY=-1SU;BYHOUR=2;BYMINUTE=30"]
    for tz in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Shanghai"):
        z = ZoneInfo(tz)
        for rule in rules:
            start = datetime(2026, 1, 31, 2, 30, tzinfo=z)
            lo, hi = datetime(2026, 3, 1, tzinfo=z), datetime(2034, 3, 1, tzinfo=z)
            want = [d.timestamp() for d in rrulestr(rule, dtstart=start).between(lo, hi, inc=True)][:400]
            got = occurrences("2026-01-31T02:30", tz, rule, lo.timestamp() - 1e-6, hi.timestamp(), limit=400)
            assert got == want, (tz, rule)


def test_a_rule_that_never_occurs_has_no_next_time():
    from memory.schedules.recurrence import vet

    never = "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30"
    assert next_after("2026-03-20T09:00", "Europe/Berlin", never, T0, inclusive=True) is None
    v = vet("2026-03-20T09:00", "Europe/Berlin", never, T0, horizon_s=366 * 86400)
    assert v.first is None and not v.past and not v.too_far
    # 29 February on a Monday: rare, not never — next found 4 years on, past the first window
    leap = "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO"
    nxt = datetime.fromtimestamp(next_after("2026-03-20T09:00", "Europe/Berlin", leap, T0), ZoneInfo("Europe/Berlin"))
    assert (nxt.year, nxt.month, nxt.day) == (2044, 2, 29)


async def test_a_stored_rule_that_never_occurs_again_ends_without_holding_the_loop(db):
    """A job stored before rules were vetted (or imported): its next time after a firing is a
    bounded walk off the loop; the job ends, saying why."""
    clock = Clock(T0)
    store = ScheduleStore(db, clock=clock, owner="A")
    await db.execute(
        "INSERT INTO schedules(owner_id, session_id, chat_id, chat_type, text, use_model, tz, dtstart, rrule,"
        " next_due, state, created_at, updated_at) VALUES ('ou_a', '', 'oc_a', 'p2p', 'x', 0, 'Europe/Berlin',"
        " '2026-03-20T09:00', 'FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30', ?, 'active', ?, ?)", (T0 + 60, T0, T0))
    clock.t = T0 + 120
    [c] = await store.claim_due()
    async with loop_gaps() as gaps:
        assert await store.finish(c, c.next_due, "sent")
    job = await store.get(c.id)
    assert job.state == "done" and job.next_due is None
    assert max(gaps, default=0) < 3.0, max(gaps)         # before: the whole walk to 9999 on the loop


def test_an_hourly_rule_stays_hourly_across_a_dst_change():
    """The hour a spring DST change skips makes an hourly rule's 02:00 the same instant as its
    03:00 (the scheduler sends it once): the zone's doing, not the rule's — accepted. Measured
    in real time only, it was refused as "0 s after the one before" in every DST zone."""
    from memory.schedules.recurrence import TooOften, vet

    for tz in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        for rule in ("FREQ=HOURLY", "FREQ=DAILY;BYHOUR=2,3", "FREQ=MINUTELY;INTERVAL=60"):
            assert vet("2026-03-20T09:00", tz, rule, T0, horizon_s=366 * 86400).first is not None, (tz, rule)
        with pytest.raises(TooOften):
            vet("2026-03-20T09:00", tz, "FREQ=DAILY;BYHOUR=9;BYMINUTE=0,30", T0, horizon_s=366 * 86400)
