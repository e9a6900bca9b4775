"""When a reminder is due: RFC 5545 recurrence in the owner's time zone (python-dateutil's
rrule over a zoneinfo-aware dtstart).

A job's start is a local wall-clock time in its zone ("09:00 in Asia/Shanghai"), so a weekly
10:00 stays 10:00 across a DST change and BYMONTHDAY=-1 is each month's last day: dateutil
steps wall-clock fields with the tzinfo attached, and the UTC instant is taken per occurrence.
A local time that does not exist (the hour skipped in spring) resolves as zoneinfo's fold=0
does (the offset before the change, i.e. an hour later in wall time). Pure functions only.
"""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrulestr

MAX_COUNT_SCAN = 10_000        # occurrences scanned for one "next after" at most (a guard)


class RecurrenceError(ValueError):
    """An RRULE, time or zone that cannot be used; the message says which, for the user."""


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


def check_rrule(rule: str) -> str:
    """The RRULE normalised (no "RRULE:" prefix), or RecurrenceError. DTSTART inside is refused:
    the start is the job's own."""
    text = rule.strip()
    if text.upper().startswith("RRULE:"):
        text = text[6:]
    if not text:
        return ""
    if "DTSTART" in text.upper() or "\n" in text:
        raise RecurrenceError("give the RRULE alone (FREQ=…;…), the start time separately")
    try:
        rrulestr(text, dtstart=datetime(2026, 1, 1, tzinfo=timezone.utc))
    except (ValueError, TypeError) as e:
        raise RecurrenceError(f"not an RFC 5545 RRULE: {rule!r} ({e})") from e
    return text


def next_after(dtstart: str, tz: str, rule: str, after: float, *, inclusive: bool = False) -> float | None:
    """The UTC epoch of the first occurrence after ``after`` (at or after, with ``inclusive``),
    None when there is none. ``dtstart`` is the local ISO start as stored."""
    start = parse_local(dtstart, tz)
    if not rule:
        t = start.timestamp()
        return t if (t >= after if inclusive else t > after) else None
    rr = rrulestr(rule, dtstart=start)
    pivot = datetime.fromtimestamp(after, tz=zone(tz))
    nxt = rr.after(pivot, inc=inclusive)
    return None if nxt is None else nxt.timestamp()


def occurrences(dtstart: str, tz: str, rule: str, after: float, until: float, *, limit: int = 50) -> list[float]:
    """The occurrences in (after, until], UTC epochs, at most ``limit``."""
    out: list[float] = []
    t = next_after(dtstart, tz, rule, after)
    while t is not None and t <= until and len(out) < limit:
        out.append(t)
        t = next_after(dtstart, tz, rule, t) if rule else None
    return out


def local_iso(t: float, tz: str) -> str:
    """``2026-03-09 10:00 (Mon) Asia/Shanghai``-like display of an epoch in a zone."""
    d = datetime.fromtimestamp(t, tz=zone(tz))
    return d.strftime("%Y-%m-%d %H:%M (%a) ") + tz
