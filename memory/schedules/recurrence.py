"""When a reminder is due: RFC 5545 recurrence in the owner's time zone (python-dateutil's
rrule over a zoneinfo-aware dtstart).

A job's start is a local wall-clock time in its zone ("09:00 in Asia/Shanghai"), so a weekly
10:00 stays 10:00 across a DST change and BYMONTHDAY=-1 is each month's last day: dateutil
steps wall-clock fields with the tzinfo attached, and the UTC instant is taken per occurrence.
A local time that does not exist (the hour skipped in spring) resolves as zoneinfo's fold=0
does (the offset before the change, i.e. an hour later in wall time). Pure functions only.

Bounded (issue 45 N1). A rule is the model's (a user's) text, and dateutil looks for the next
occurrence by stepping period by period until it finds one or passes the year 9999: a rule
that never occurs (``FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30``) walked ~8,000 years, 7–16 s of
CPU. So every search here is confined to a window: the rule runs in a frame shifted forward
by whole years whose calendars are the same as the real ones over the window (same leap
years, same weekday of 1 January: the 400-year cycle, usually 28 years), placed as close to
9999 as that allows, so dateutil's own end comes at most ~28 years of periods after the
window instead of thousands. On top, a search walks at most ``SCAN_LIMIT`` occurrences and
``SCAN_SECONDS`` (``SearchTooLong``), and ``check_rrule`` refuses, before building anything,
the rules whose periods are shorter than an hour or hold more than one occurrence an hour
(they would be refused as too frequent anyway; they are also what makes a period costly).
Callers run these off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import lru_cache
from typing import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrulestr

MAX_COUNT_SCAN = 10_000        # occurrences skipped over for one "next after" at most (a guard)
SCAN_LIMIT = 1_000_000         # occurrences one search may walk (an hourly job: 114 years of them)
SCAN_SECONDS = 5.0             # and the time it may take
WITHIN_S = 30 * 366 * 86400.0  # "the next occurrence" is looked for this far ahead (28-year gaps exist)
MIN_GAP_S = 3600.0             # at most hourly, between real consecutive occurrences
GAP_WINDOW_S = 366 * 86400.0   # how far past the first occurrence the gaps are checked
_PER_DAY = 24                  # more times of day than this: two are less than an hour apart
_LAST_EPOCH = 253_370_000_000.0   # late in 9998: a window never reaches past what datetime holds


class RecurrenceError(ValueError):
    """An RRULE, time or zone that cannot be used; the message says which, for the user."""


class TooOften(RecurrenceError):
    """Two occurrences less than ``MIN_GAP_S`` apart."""


class SearchTooLong(RecurrenceError):
    """A search walked more occurrences or time than it may."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise RecurrenceError(f"unknown time zone {name!r}") from e


def parse_local(when: str, tz: str) -> datetime:
    """An ISO time as the owner's local wall time (aware, in ``tz``). An ISO time with an offset
    is converted to ``tz``; one without is read as local in ``tz``."""
    try:
        dt = datetime.fromisoformat(when.strip())
    except ValueError as e:
        raise RecurrenceError(f"not an ISO 8601 time: {when!r}") from e
    z = zone(tz)
    return dt.astimezone(z) if dt.tzinfo is not None else dt.replace(tzinfo=z)


def _parts(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(";"):
        name, _, value = part.partition("=")
        if name.strip():
            out[name.strip().upper()] = value.strip()
    return out


def _many(parts: dict[str, str], name: str) -> int:
    value = parts.get(name, "")
    return len([v for v in value.split(",") if v.strip()]) if value else 1


def check_rrule(rule: str) -> str:
    """The RRULE normalised (no "RRULE:" prefix), or RecurrenceError (``TooOften`` for a rule
    whose form alone makes it more frequent than hourly). DTSTART inside is refused: the start
    is the job's own. Cheap: the form is checked before dateutil builds anything."""
    text = rule.strip()
    if text.upper().startswith("RRULE:"):
        text = text[6:]
    if not text:
        return ""
    if "DTSTART" in text.upper() or "\n" in text:
        raise RecurrenceError("give the RRULE alone (FREQ=…;…), the start time separately")
    parts = _parts(text)
    if "BYEASTER" in parts:     # dateutil's extension, not RFC 5545 (and not on the 400-year cycle)
        raise RecurrenceError(f"not an RFC 5545 RRULE: {rule!r} (BYEASTER)")
    freq = parts.get("FREQ", "").upper()
    try:
        interval = int(parts.get("INTERVAL", "1") or "1")
    except ValueError:
        interval = 1            # dateutil says what is wrong with it below
    per_hour = _many(parts, "BYMINUTE") * _many(parts, "BYSECOND")
    if ((freq == "SECONDLY" and interval < 3600) or (freq == "MINUTELY" and interval < 60)
            or (freq == "MINUTELY" and _many(parts, "BYSECOND") > 1) or (freq == "HOURLY" and per_hour > 1)
            or (freq in ("DAILY", "WEEKLY", "MONTHLY", "YEARLY") and _many(parts, "BYHOUR") * per_hour > _PER_DAY)):
        raise TooOften(f"{text} repeats more often than hourly")
    try:
        rrulestr(text, dtstart=datetime(2026, 1, 1, tzinfo=timezone.utc))
    except (ValueError, TypeError, OverflowError) as e:
        raise RecurrenceError(f"not an RFC 5545 RRULE: {rule!r} ({e})") from e
    return text


# -- the bounded walk ------------------------------------------------------------------------

def _same_calendar(y: int, s: int) -> bool:
    return calendar.isleap(y) == calendar.isleap(y + s) and date(y, 1, 1).weekday() == date(y + s, 1, 1).weekday()


@lru_cache(maxsize=256)
def _shift(first_year: int, last_year: int) -> int:
    """Years to add to ``first_year..last_year`` (with a year either side, for ISO weeks) so
    they keep their calendar and end as near 9999 as possible; 0 when they are already near."""
    lo, hi = max(1, first_year - 1), last_year + 1
    for s in range(datetime.max.year - 1 - hi, 0, -1):       # the 400-year cycle always matches
        if all(_same_calendar(y, s) for y in range(lo, hi + 1)):
            return s
    return 0


def _moved(d: datetime, years: int) -> datetime:
    return d.replace(year=d.year + years) if years else d


def _walk(start: datetime, rule: str, end: datetime, *, limit: int = SCAN_LIMIT,
          seconds: float = SCAN_SECONDS) -> Iterator[datetime]:
    """The occurrences of ``rule`` from ``start`` (aware, local) up to ``end``, in order, then
    at most one past ``end`` (which says the window held no more); SearchTooLong past the
    budget. Wall times in ``start``'s zone, as dateutil gives them."""
    try:
        real = rrulestr(rule, dtstart=start)
    except (ValueError, TypeError, OverflowError) as e:
        raise RecurrenceError(f"not an RFC 5545 RRULE: {rule!r} ({e})") from e
    last = max(start.year, end.year)
    s = _shift(start.year, last) if last < datetime.max.year - 2 else 0
    rr = real
    if s:
        until = real._until             # noqa: SLF001 - dateutil has no accessor; UTC when set
        if until is not None:
            until = until.astimezone(start.tzinfo)
            # same tzinfo: compared by wall time; one past the window is cut by ``end`` anyway
            until = _moved(until, s) if until.year <= last else None
        rr = real.replace(dtstart=_moved(start, s), until=until)
    t0 = time.monotonic()
    for n, occ in enumerate(rr, 1):
        if n > limit or (n % 1024 == 0 and time.monotonic() - t0 > seconds):
            raise SearchTooLong(f"{rule}: no answer within {limit} occurrences / {seconds:g} s")
        try:
            occ = _moved(occ, -s)
        except ValueError:      # 29 February of a year past the window whose real twin is not leap
            return
        yield occ
        if occ > end:
            return


def next_after(dtstart: str, tz: str, rule: str, after: float, *, inclusive: bool = False,
               within: float = WITHIN_S) -> float | None:
    """The UTC epoch of the first occurrence after ``after`` (at or after, with ``inclusive``),
    None when there is none within ``within`` seconds of it. ``dtstart`` is the local ISO
    start as stored."""
    start = parse_local(dtstart, tz)
    if not rule:
        t = start.timestamp()
        return t if (t >= after if inclusive else t > after) else None
    z = zone(tz)
    pivot = datetime.fromtimestamp(after, tz=z)
    end = datetime.fromtimestamp(min(after + within, _LAST_EPOCH), tz=z)
    for occ in _walk(start, rule, end):
        if occ > end:
            return None
        if occ > pivot or (inclusive and occ >= pivot):
            return occ.timestamp()
    return None


def next_skipping(dtstart: str, tz: str, rule: str, due_at: float, skip_until: float | None,
                  *, within: float = WITHIN_S) -> tuple[float | None, int]:
    """After the occurrence ``due_at``: the next occurrence at or after ``skip_until`` (or just
    the next, without it) and how many were passed over (at most ``MAX_COUNT_SCAN``) — one
    walk, not one search per occurrence skipped."""
    if not rule:
        return None, 0
    z = zone(tz)
    pivot = datetime.fromtimestamp(due_at, tz=z)
    floor = datetime.fromtimestamp(skip_until, tz=z) if skip_until is not None else None
    end = datetime.fromtimestamp(min(max(due_at, skip_until or 0.0) + within, _LAST_EPOCH), tz=z)
    skipped = 0
    for occ in _walk(parse_local(dtstart, tz), rule, end):
        if occ > end:
            break
        if occ <= pivot:
            continue
        if floor is not None and occ < floor and skipped < MAX_COUNT_SCAN:
            skipped += 1
            continue
        return occ.timestamp(), skipped
    return None, skipped


def occurrences(dtstart: str, tz: str, rule: str, after: float, until: float, *, limit: int = 50) -> list[float]:
    """The occurrences in (after, until], UTC epochs, at most ``limit``."""
    if not rule:
        t = next_after(dtstart, tz, rule, after)
        return [t] if t is not None and t <= until else []
    z = zone(tz)
    lo, hi = datetime.fromtimestamp(after, tz=z), datetime.fromtimestamp(until, tz=z)
    out: list[float] = []
    for occ in _walk(parse_local(dtstart, tz), rule, hi):
        if occ > hi or len(out) >= limit:
            break
        if occ > lo:
            out.append(occ.timestamp())
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``vet`` found: ``first`` (the first occurrence at or after now) or why there is none."""
    first: float | None
    past: bool = False            # the rule ended (COUNT/UNTIL) before now
    too_far: bool = False         # its first occurrence from now is past the horizon


def vet(dtstart: str, tz: str, rule: str, now: float, *, horizon_s: float, min_gap_s: float = MIN_GAP_S,
        gap_window_s: float = GAP_WINDOW_S) -> Verdict:
    """A new job's rule checked by its real occurrences: the first at or after ``now`` within
    ``horizon_s``, and no two consecutive ones (from the start until ``gap_window_s`` past the
    first) closer than ``min_gap_s`` (``TooOften``, which names them). ``first`` None with
    neither flag: the rule never occurs in the window (``BYMONTH=2;BYMONTHDAY=30``)."""
    start = parse_local(dtstart, tz)
    if not rule:
        t = start.timestamp()
        return Verdict(t if t > now else None, past=t <= now, too_far=t > now + horizon_s)
    z = zone(tz)
    pivot = datetime.fromtimestamp(now, tz=z)
    last = datetime.fromtimestamp(now + horizon_s, tz=z)
    end = datetime.fromtimestamp(now + horizon_s + gap_window_s, tz=z)
    first: datetime | None = None
    prev: tuple[float, datetime] | None = None
    seen = False
    for occ in _walk(start, rule, end):
        t = occ.timestamp()
        # Apart in real time or on the owner's clock: the hour a DST change skips makes an hourly
        # rule's 02:00 the same instant as its 03:00 (sent once) — the zone's doing, not the rule's.
        if prev is not None and max(t - prev[0], (occ.replace(tzinfo=None) - prev[1]).total_seconds()) < min_gap_s:
            raise TooOften(f"{rule} repeats more often than hourly: {occ.isoformat(' ', 'seconds')} comes "
                           f"{int(t - prev[0])} s after the one before")
        prev = (t, occ.replace(tzinfo=None))
        seen = True
        if first is None and occ >= pivot:
            if occ > last:
                return Verdict(None, too_far=True)
            first = occ
        if first is not None and t > first.timestamp() + gap_window_s:
            break
    if first is None:
        parts = _parts(rule)
        return Verdict(None, past=seen and ("COUNT" in parts or "UNTIL" in parts))
    return Verdict(first.timestamp())


def local_iso(t: float, tz: str) -> str:
    """``2026-03-09 10:00 (Mon) Asia/Shanghai``-like display of an epoch in a zone."""
    d = datetime.fromtimestamp(t, tz=zone(tz))
    return d.strftime("%Y-%m-%d %H:%M (%a) ") + tz
