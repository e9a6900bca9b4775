"""The reminder tools' checks (bot/schedules/reminders.py through bot/schedules/tool.py, the real store
on both backends): past, beyond the horizon, too frequent, over the per-user limit, malformed
— refused with a clear is_error answer; the owner comes from the scope, never the arguments."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from bot.schedules.reminders import Limits, Reminders
from bot.schedules.timezones import UserZones, zone_in_text
from bot.tools import ToolContext
from bot.tools.registry import ToolRegistry
from bot.schedules.tool import ReminderTools
from memory.schedules.store import ScheduleStore
from memory.scope import Scope
from tests.loop_gaps import loop_gaps

TZ = "Asia/Shanghai"
NOW = datetime(2026, 3, 20, 8, 0, tzinfo=ZoneInfo(TZ)).timestamp()
ALICE = Scope(user_id="ou_alice", chat_id="oc_p2p", chat_type="p2p")


def _ctx(db, scope=ALICE, **limits):
    clock = lambda: NOW  # noqa: E731
    r = Reminders(ScheduleStore(db, clock=clock), UserZones(None, None, TZ), Limits(**limits), clock=clock)
    return ToolContext(scope=scope, facts=None, procedures=None, profile=None), r


async def _call(ctx_r, name, **args):
    """Through the tool port, as the loop runs it (schema check, scope from the context)."""
    ctx, r = ctx_r
    registry = ToolRegistry([ReminderTools(r)])
    return await registry.run(registry.offer(ctx), {"id": "t1", "name": name, "input": args}, ctx)


async def test_a_reminder_is_scheduled_listed_and_cancelled_in_the_users_zone(db):
    ctx = _ctx(db); r = ctx[1]
    out = await _call(ctx, "schedule_message", text="给客户回电话", at="2026-03-21T09:00")
    assert not out.is_error and "2026-03-21 09:00 (Sat) Asia/Shanghai" in out.content
    [job] = await r.store.for_owner("ou_alice")
    assert job.next_due == datetime(2026, 3, 21, 9, 0, tzinfo=ZoneInfo(TZ)).timestamp()
    listed = await _call(ctx, "list_schedules")
    assert f"#{job.id}" in listed.content
    assert "now: 2026-03-20 08:00 (Fri) Asia/Shanghai" in listed.content     # what "in 20 minutes" needs
    bob = _ctx(db, Scope(user_id="ou_bob", chat_id="oc_p2p", chat_type="p2p"))
    assert (await _call(bob, "cancel_schedule", id=job.id)).is_error           # not Bob's
    assert not (await _call(ctx, "cancel_schedule", id=job.id)).is_error
    assert "no active reminders" in (await _call(ctx, "list_schedules")).content


async def test_past_far_frequent_malformed_and_over_the_limit_are_refused_clearly(db):
    ctx = _ctx(db, per_user=2, horizon_days=366); r = ctx[1]
    past = await _call(ctx, "schedule_message", text="x", at="2026-03-20T07:00")
    assert past.is_error and "in the past" in past.content and "2026-03-20 08:00" in past.content
    far = await _call(ctx, "schedule_message", text="x", at="2027-06-01T09:00")
    assert far.is_error and "more than 366 days ahead" in far.content
    often = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00", rrule="FREQ=MINUTELY")
    assert often.is_error and "hourly" in often.content
    bad = await _call(ctx, "schedule_message", text="x", at="tomorrow 9am")
    assert bad.is_error and "ISO 8601" in bad.content
    badrule = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00", rrule="FREQ=SOMETIMES")
    assert badrule.is_error and "RRULE" in badrule.content
    for _ in range(2):
        assert not (await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00")).is_error
    over = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00")
    assert over.is_error and "already have 2 active reminders" in over.content
    assert await r.store.count_active("ou_alice") == 2
    # a weekly rule whose start is past still has a future occurrence: accepted
    weekly = await _call(ctx, "schedule_message", text="周报", at="2026-03-16T10:00", rrule="FREQ=WEEKLY;BYDAY=MO")
    assert weekly.is_error and "already have" in weekly.content       # the limit, not "past"


def test_a_zone_is_read_from_the_profile_text():
    assert zone_in_text("## 基本信息\n- 时区: Europe/Berlin\n") == "Europe/Berlin"
    assert zone_in_text("lives in Asia/Nowhere") == ""


# -- issue 45 N1, N7: rules the model (a user) writes -----------------------------------------

async def test_a_rule_that_never_occurs_is_refused_and_the_loop_is_not_held(db):
    ctx = _ctx(db); r = ctx[1]
    async with loop_gaps() as gaps:
        out = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00",
                          rrule="FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30")
    assert out.is_error and "no occurrence in the 366 days" in out.content, out.content
    assert await r.store.count_active("ou_alice") == 0
    # the loop went on meanwhile: before, it was held for the whole walk to the year 9999 (7-16 s)
    assert max(gaps, default=0) < 3.0, max(gaps)


async def test_more_often_than_hourly_is_judged_by_the_real_occurrences(db):
    ctx = _ctx(db); r = ctx[1]
    refused = {
        "FREQ=HOURLY;BYMINUTE=" + ",".join(map(str, range(60))): "",           # a message a minute
        "FREQ=HOURLY;BYSECOND=0,30": "",
        "FREQ=DAILY;BYHOUR=9;BYMINUTE=0,30": "1800 s",                         # twice within the hour
        "FREQ=DAILY;BYHOUR=0,23;BYMINUTE=0,30;BYSETPOS=1,-1": "1800 s",        # 23:30, then 00:00
        "FREQ=MINUTELY": "", "FREQ=SECONDLY;INTERVAL=60": "",
    }
    for rule, says in refused.items():
        out = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00", rrule=rule)
        assert out.is_error and "at most hourly" in out.content and says in out.content, (rule, out.content)
    for rule in ("FREQ=MINUTELY;INTERVAL=90", "FREQ=HOURLY;BYMINUTE=15", "FREQ=DAILY;BYHOUR=9,10",
                 "FREQ=DAILY;BYHOUR=0,23;BYMINUTE=0"):
        out = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00", rrule=rule)
        assert not out.is_error, (rule, out.content)
    assert await r.store.count_active("ou_alice") == 4


async def test_a_chat_holds_at_most_its_cap_of_reminders_whoever_set_them(db):
    group = dict(chat_id="oc_team", chat_type="group")
    alice, bob, carol = (_ctx(db, Scope(user_id=u, **group), per_chat=2) for u in ("ou_alice", "ou_bob", "ou_carol"))
    assert not (await _call(alice, "schedule_message", text="a", at="2026-03-21T09:00")).is_error
    assert not (await _call(bob, "schedule_message", text="b", at="2026-03-21T09:00")).is_error
    third = await _call(carol, "schedule_message", text="c", at="2026-03-21T09:00")
    assert third.is_error and "this chat already has 2 active reminders" in third.content
    own = _ctx(db, Scope(user_id="ou_carol", chat_id="oc_p2p_carol", chat_type="p2p"), per_chat=2)
    assert not (await _call(own, "schedule_message", text="c", at="2026-03-21T09:00")).is_error
    assert [j.owner_id for j in await alice[1].store.for_chat("oc_team")] == ["ou_alice", "ou_bob"]


async def test_a_start_far_in_the_past_and_a_rule_that_ended_are_refused(db):
    ctx = _ctx(db)
    old = await _call(ctx, "schedule_message", text="x", at="1900-01-01T09:00", rrule="FREQ=HOURLY")
    assert old.is_error and "more than 366 days in the past" in old.content
    ended = await _call(ctx, "schedule_message", text="x", at="2026-03-01T09:00", rrule="FREQ=DAILY;COUNT=3")
    assert ended.is_error and "in the past" in ended.content
    easter = await _call(ctx, "schedule_message", text="x", at="2026-03-21T09:00", rrule="FREQ=YEARLY;BYEASTER=0")
    assert easter.is_error and "BYEASTER" in easter.content
