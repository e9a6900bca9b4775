"""Relative dates said in a session, resolved against the session's date (issue 31).

An episode is read weeks later: "昨天" or "last Saturday" in it then means nothing, and a
"when did…" question cannot be answered. ``resolve(text, day)`` writes the absolute date
after each relative expression it knows — ``昨天（2026-11-30）``, ``last Saturday (2026-11-28)``,
``上个月（2026-10）`` — leaving the words as said. Applied when the episode is written
(``EpisodeStore.write``: its summary and turn lines, against the session's day). Text already
followed by a date is left alone, so writing the episode again does not stack dates.

Readings: 昨天/yesterday etc. count days from ``day``; "last <weekday>" is the latest such day
before ``day``, "next <weekday>" the first after it, "this <weekday>" that day of ``day``'s week;
上周X / 这周X / 下周X the weekday X of the previous / same / next week (weeks start on Monday).
"""

from __future__ import annotations

import datetime as dt
import re

_ZH_DAYS = {"大前天": -3, "前天": -2, "昨天": -1, "昨日": -1, "今天": 0, "明天": 1, "后天": 2, "大后天": 3}
_ZH_WEEKDAY = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_EN_WEEKDAY = {d: i for i, d in enumerate(
    ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))}
_EN_DAYS = {"yesterday": -1, "today": 0, "tomorrow": 1, "the day before yesterday": -2,
            "the day after tomorrow": 2}
_EN_NUM = {"one": 1, "a": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10}

_ALREADY = r"(?![ \t]*[（(](?:\d{4}|week of))"
_ZH = re.compile(
    r"(?P<week>(?P<wrel>上上|上|这|本|下下|下)(?:个)?(?:周|星期|礼拜)(?P<wd>[一二三四五六日天]))" + _ALREADY +
    r"|(?P<day>大前天|前天|昨天|昨日|今天|明天|大后天|后天)" + _ALREADY +
    r"|(?P<month>上个月|这个月|本月|下个月)" + _ALREADY +
    r"|(?P<year>去年|今年|明年|前年)" + _ALREADY +
    # (?<!\d) and at most 4 digits: a number starts where its digits do — with a bare \d+ a run
    # of 20,000 digits was tried from each of its digits (quadratic: 4.8 s on the loop), and
    # "99999999999天前" overflowed the date arithmetic (issue 45 sweep).
    r"|(?P<ago>(?<!\d)(?P<n>\d{1,4}|[一两二三四五六七八九十])(?P<unit>天|周|个星期|个月|年)前)" + _ALREADY)
_EN = re.compile(
    r"\b(?:(?P<rel>last|this|next|on)\s+(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday))\b" + _ALREADY +
    r"|\b(?P<day>the day before yesterday|the day after tomorrow|yesterday|today|tomorrow)\b" + _ALREADY +
    r"|\b(?P<per>(?P<prel>last|next)\s+(?P<unit>week|month|year))\b" + _ALREADY +
    r"|\b(?P<ago>(?P<n>\d{1,4}|one|a|two|three|four|five|six|seven|eight|nine|ten)\s+(?P<aunit>days?|weeks?|months?|years?)\s+ago)\b"
    + _ALREADY, re.I)
_ZH_NUM = {"一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}


def _month(day: dt.date, delta: int) -> str:
    m = day.month - 1 + delta
    return f"{day.year + m // 12:04d}-{m % 12 + 1:02d}" if day.year + m // 12 >= 1 else ""


def _ago(day: dt.date, n: int, unit: str) -> str:
    try:
        return _ago_of(day, n, unit)
    except OverflowError:       # before the year 1: left as said
        return ""


def _ago_of(day: dt.date, n: int, unit: str) -> str:
    if unit.startswith(("天", "day")):
        return (day - dt.timedelta(days=n)).isoformat()
    if unit.startswith(("周", "个星期", "week")):
        return (day - dt.timedelta(weeks=n)).isoformat()
    if unit.startswith(("个月", "month")):
        return _month(day, -n)
    return f"{day.year - n:04d}" if day.year - n >= 1 else ""


def _zh(m: re.Match, day: dt.date) -> str:
    if m.group("week"):
        shift = {"上上": -2, "上": -1, "这": 0, "本": 0, "下": 1, "下下": 2}[m.group("wrel")]
        monday = day - dt.timedelta(days=day.weekday()) + dt.timedelta(weeks=shift)
        return (monday + dt.timedelta(days=_ZH_WEEKDAY[m.group("wd")])).isoformat()
    if m.group("day"):
        return (day + dt.timedelta(days=_ZH_DAYS[m.group("day")])).isoformat()
    if m.group("month"):
        return _month(day, {"上个月": -1, "这个月": 0, "本月": 0, "下个月": 1}[m.group("month")])
    if m.group("year"):
        return f"{day.year + {'前年': -2, '去年': -1, '今年': 0, '明年': 1}[m.group('year')]:04d}"
    n = m.group("n")
    return _ago(day, int(n) if n.isdigit() else _ZH_NUM[n], m.group("unit"))


def _en(m: re.Match, day: dt.date) -> str:
    if m.group("wd"):
        rel, wd = m.group("rel").casefold(), _EN_WEEKDAY[m.group("wd").casefold()]
        if rel == "last":
            back = (day.weekday() - wd) % 7 or 7
            return (day - dt.timedelta(days=back)).isoformat()
        if rel == "next":
            ahead = (wd - day.weekday()) % 7 or 7
            return (day + dt.timedelta(days=ahead)).isoformat()
        if rel == "this":
            return (day - dt.timedelta(days=day.weekday()) + dt.timedelta(days=wd)).isoformat()
        # "on Saturday" said of the past or the future: leave it (no direction)
        return ""
    if m.group("day"):
        return (day + dt.timedelta(days=_EN_DAYS[m.group("day").casefold()])).isoformat()
    if m.group("per"):
        sign = -1 if m.group("prel").casefold() == "last" else 1
        unit = m.group("unit").casefold()
        if unit == "week":
            monday = day - dt.timedelta(days=day.weekday()) + dt.timedelta(weeks=sign)
            return f"week of {monday.isoformat()}"
        if unit == "month":
            return _month(day, sign)
        return f"{day.year + sign:04d}"
    n = m.group("n").casefold()
    return _ago(day, int(n) if n.isdigit() else _EN_NUM[n], m.group("aunit").casefold())


def resolve(text: str, day: dt.date | None) -> str:
    """``text`` with the absolute date after each relative date expression (module docs)."""
    if not text or day is None:
        return text

    def zh(m: re.Match) -> str:
        when = _zh(m, day)
        return f"{m.group(0)}（{when}）" if when else m.group(0)

    def en(m: re.Match) -> str:
        when = _en(m, day)
        return f"{m.group(0)} ({when})" if when else m.group(0)

    return _EN.sub(en, _ZH.sub(zh, text))


def day_of(ts: float | None) -> dt.date | None:
    """The UTC day of a timestamp (the day ``Episode.date`` shows)."""
    if not ts:
        return None
    return dt.datetime.fromtimestamp(float(ts), dt.timezone.utc).date()
