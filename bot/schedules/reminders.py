"""Reminders as the product offers them: what the model's ``schedule_message`` /
``list_schedules`` / ``cancel_schedule`` tools and the ``/reminders`` command do.

The model gives an ISO time (the user's local time, or one with an offset) and optionally an
RFC 5545 RRULE; the product checks it — a real time and rule, not in the past, not beyond the
horizon (``ETHAN_REMINDER_HORIZON_DAYS``), occurring at all, no two occurrences less than an
hour apart (its real occurrences, not its FREQ), at most ``ETHAN_REMINDERS_PER_USER`` active per
user and ``ETHAN_REMINDERS_PER_CHAT`` per chat — and refuses with a sentence the model can pass
on (and one ``reminder.refused`` line). Whose reminder it is comes from the event (the scope),
never from the model's arguments.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from bot.infra.log import get_logger
from memory.schedules.recurrence import (RecurrenceError, SearchTooLong, TooOften, Verdict, check_rrule, local_iso,
                               parse_local, vet)
from memory.schedules.store import Schedule, ScheduleStore, TooManySchedules
from memory.scope import Scope

log = get_logger("ethan.reminders")


class ReminderRefused(ValueError):
    """A clear sentence for the user (through the model, or the command's answer)."""


class ScheduleMessageInput(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    text: str = Field(min_length=1, max_length=1000,
                      description="What to send at that time, in the user's language (e.g. '给客户回电话').")
    at: str = Field(min_length=10, max_length=40,
                    description="The (first) time, ISO 8601, in the user's local time zone unless it has an "
                                "offset, e.g. 2026-03-02T09:00. Work it out from the current date and time.")
    rrule: str = Field(default="", max_length=300,
                       description="For a repeating reminder: an RFC 5545 RRULE without DTSTART, e.g. "
                                   "FREQ=WEEKLY;BYDAY=MO or FREQ=MONTHLY;BYMONTHDAY=-1. Empty for a one-off.")
    compose: bool = Field(default=False,
                          description="True when the message should be written at that time with what you "
                                      "remember about the user (e.g. 'what is on my list today'); false sends "
                                      "the text as it is.")


class ListSchedulesInput(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CancelScheduleInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=1, description="The reminder's id, as list_schedules shows it.")


@dataclass(frozen=True, slots=True)
class Limits:
    per_user: int = 50
    per_chat: int = 30
    horizon_days: int = 366
    grace_hours: float = 6.0


class Reminders:
    def __init__(self, store: ScheduleStore, zones, limits: Limits, *,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.zones = zones            # bot.schedules.timezones.UserZones
        self.limits = limits
        self.wake = wake              # the scheduler re-reads its next due time
        self.clock = clock

    async def schedule(self, scope: Scope, args: ScheduleMessageInput, *, session_id: str = "") -> Schedule:
        tz = await self.zones.zone_of(scope.user_id)
        now = self.clock()
        try:
            start = parse_local(args.at, tz)
            dtstart = start.replace(tzinfo=None).isoformat(timespec="minutes" if start.second == 0 else "seconds")
            # The rule is the model's text: checked by its real occurrences, in a bounded walk
            # off the loop (memory/schedules/recurrence.py) — never dateutil's search to the year 9999 here.
            verdict = await asyncio.to_thread(self._vet, dtstart, tz, args.rrule, now)
        except TooOften as e:
            raise self._refused(scope, "too_often", "refused: a reminder may repeat at most hourly — "
                                f"{e}", rrule=args.rrule) from e
        except SearchTooLong as e:
            raise self._refused(scope, "too_complex", f"refused: the rule {args.rrule!r} takes too long to "
                                "work out; give a simpler one", rrule=args.rrule) from e
        except RecurrenceError as e:
            raise self._refused(scope, "invalid", f"refused: {e}", rrule=args.rrule) from e
        rule, v = verdict
        if v.past or (v.first is None and not rule):
            raise self._refused(scope, "past", f"refused: {args.at} ({tz}) is in the past — it is now "
                                f"{local_iso(now, tz)}; ask for a time in the future")
        if v.too_far:
            raise self._refused(scope, "too_far", f"refused: {args.at} is more than {self.limits.horizon_days} "
                                "days ahead (the limit)")
        if v.first is None:
            raise self._refused(scope, "never", f"refused: the rule {rule} has no occurrence in the "
                                f"{self.limits.horizon_days} days from now (a date that does not exist, "
                                "e.g. BYMONTHDAY=30 with BYMONTH=2, never comes); check it", rrule=rule)
        try:
            job = await self.store.add(owner_id=scope.user_id, chat_id=scope.chat_id, chat_type=scope.chat_type,
                                       text=args.text, tz=tz, dtstart=dtstart, rrule=rule, use_model=args.compose,
                                       session_id=session_id, max_active=self.limits.per_user,
                                       max_in_chat=self.limits.per_chat, first=v.first)
        except TooManySchedules as e:
            if e.scope == "chat":
                raise self._refused(scope, "chat_limit", f"refused: this chat already has {e.limit} active "
                                    "reminders (the limit); cancel one first (/reminders)") from e
            raise self._refused(scope, "user_limit", f"refused: you already have {e.limit} active reminders "
                                "(the limit); cancel one first (/reminders)") from e
        log.info("reminder.scheduled", schedule_id=job.id, chat_id=scope.chat_id, user_id=scope.user_id,
                 next_due=job.next_due, recurring=bool(rule), tz=tz)
        self.wake()
        return job

    def _vet(self, dtstart: str, tz: str, rrule: str, now: float) -> tuple[str, Verdict]:
        """In a worker thread: the rule's form, then its occurrences (bounded)."""
        rule = check_rrule(rrule)
        start = parse_local(dtstart, tz).timestamp()
        if rule and start < now - self.limits.horizon_days * 86400:
            # the walk starts at the start: a start decades back is a long walk for nothing
            raise RecurrenceError(f"the first time {dtstart} is more than {self.limits.horizon_days} days "
                                  "in the past; give a recent one")
        return rule, vet(dtstart, tz, rule, now, horizon_s=self.limits.horizon_days * 86400)

    @staticmethod
    def _refused(scope: Scope, reason: str, sentence: str, **extra) -> ReminderRefused:
        log.info("reminder.refused", chat_id=scope.chat_id, user_id=scope.user_id, reason=reason,
                 **{k: str(v)[:300] for k, v in extra.items()})
        return ReminderRefused(sentence)

    async def list(self, scope: Scope, *, chat: bool = False) -> list[Schedule]:
        """The user's own active reminders; ``chat`` (an admin): this chat's, everyone's."""
        if chat:
            return await self.store.for_chat(scope.chat_id)
        return await self.store.for_owner(scope.user_id)

    async def cancel(self, scope: Scope, job_id: int, *, admin: bool = False) -> bool:
        done = await self.store.cancel(job_id, owner_id=scope.user_id)
        if not done and admin:        # an admin may cancel any reminder of this chat
            done = await self.store.cancel(job_id, chat_id=scope.chat_id)
        if done:
            log.info("reminder.cancelled", schedule_id=job_id, chat_id=scope.chat_id, user_id=scope.user_id)
            self.wake()
        return done

    async def missed(self, scope: Scope):
        since = self.clock() - 30 * 86400
        return await self.store.missed(scope.user_id, since=since)

    # -- what the model's tools answer ------------------------------------------------
    async def tool_schedule(self, scope: Scope, args: ScheduleMessageInput, *, session_id: str = "") -> str:
        job = await self.schedule(scope, args, session_id=session_id)
        return (f"scheduled reminder #{job.id}: first at {local_iso(job.next_due or 0, job.tz)}"
                + (f", repeating {job.rrule}" if job.rrule else "")
                + ". Tell the user the time and that /reminders lists and /reminders cancel "
                  f"{job.id} cancels it.")

    async def tool_list(self, scope: Scope, args: ListSchedulesInput | None = None) -> str:
        jobs = await self.list(scope)
        tz = await self.zones.zone_of(scope.user_id)
        now = f"now: {local_iso(self.clock(), tz)} (the user's zone)\n"
        if not jobs:
            return now + "no active reminders"
        return now + "\n".join(describe(j) for j in jobs)

    async def tool_cancel(self, scope: Scope, args: CancelScheduleInput) -> str:
        if await self.cancel(scope, args.id):
            return f"cancelled reminder #{args.id}"
        raise ReminderRefused(f"no active reminder #{args.id} of this user")


def describe(job: Schedule, *, zh: bool = False) -> str:
    due = local_iso(job.next_due, job.tz) if job.next_due is not None else ("无" if zh else "none")
    rep = f" ({job.rrule})" if job.rrule else ""
    return f"#{job.id} {due}{rep} — {job.text[:80]}"
