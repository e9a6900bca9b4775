"""Relative dates resolved against the session's date when the episode is written (issue 31)."""

from __future__ import annotations

import datetime as dt

import pytest

from memory.episodes.store import EpisodeStore
from memory.episodes.reltime import resolve
from memory.scope import Scope

TUESDAY = dt.date(2026, 12, 1)


@pytest.mark.parametrize("said, resolved", [
    ("我昨天去了医院", "我昨天（2026-11-30）去了医院"),
    ("上周六看了电影", "上周六（2026-11-28）看了电影"),
    ("下周三面试", "下周三（2026-12-09）面试"),
    ("两天前下雨了", "两天前（2026-11-29）下雨了"),
    ("去年搬的家", "去年（2025）搬的家"),
    ("上个月开始学陶艺", "上个月（2026-11）开始学陶艺"),
    ("I went hiking last Saturday", "I went hiking last Saturday (2026-11-28)"),
    ("yesterday I rested", "yesterday (2026-11-30) I rested"),
    ("next Friday a trip", "next Friday (2026-12-04) a trip"),
    ("3 weeks ago it snowed", "3 weeks ago (2026-11-10) it snowed"),
    ("I started last month", "I started last month (2026-11)"),
    ("on Saturday we met", "on Saturday we met"),            # no direction: left as said
])
def test_relative_dates_get_the_absolute_date_beside_them(said, resolved):
    assert resolve(said, TUESDAY) == resolved
    assert resolve(resolved, TUESDAY) == resolved            # written again: no second date


async def test_an_episode_keeps_the_absolute_date_of_what_was_said(db):
    store = EpisodeStore(db)
    ended = dt.datetime(2026, 12, 1, 10, tzinfo=dt.timezone.utc).timestamp()
    ep = await store.write(session_id="s1", user_id="u", chat_type="p2p", summary="用户昨天去看了牙医。",
                           turn_count=2, turns=["我昨天去看了牙医", "I bought a new bike last Saturday"],
                           started_at=ended - 600, ended_at=ended)
    assert ep.summary == "用户昨天（2026-11-30）去看了牙医。"
    assert await store.turns(ep.id) == ["我昨天（2026-11-30）去看了牙医", "I bought a new bike last Saturday (2026-11-28)"]
    got = await store.recall(Scope("u", "oc_u", "p2p"), "我什么时候去看的牙医")
    assert got and "2026-11-30" in "\n".join(got[0].evidence)


# -- issue 45 sweep: a user's line is read in linear time and never overflows a date --------

@pytest.mark.timeout(60)
async def test_a_turn_of_digits_is_resolved_in_linear_time_when_the_episode_is_written(db):
    """A user line of 100,000 digits: the Chinese "n 天前" pattern was tried from each digit to
    the end of the run (quadratic: 20,000 digits took 4.8 s on the event loop; this, minutes)."""
    store = EpisodeStore(db)
    ended = dt.datetime(2026, 12, 1, 10, tzinfo=dt.timezone.utc).timestamp()
    line = "1" * 100_000
    ep = await store.write(session_id="s1", user_id="u", chat_type="p2p", summary="用户发了一串数字。",
                           turn_count=2, turns=[line, "两天前下雨了"], started_at=ended - 600, ended_at=ended)
    first, second = await store.turns(ep.id)          # (a turn is kept to its first 1,000 characters)
    assert set(first) == {"1"} and second == "两天前（2026-11-29）下雨了"


@pytest.mark.parametrize("said", ["99999999999天前去过", "1" * 5000 + "天前", "12345678901234567890 days ago", "9999年前", "9999 years ago"])
def test_a_number_too_large_for_a_date_is_left_as_said(said):
    assert resolve(said, TUESDAY) == said          # was OverflowError / ValueError (int of 5,000 digits) / a year "-7973"
