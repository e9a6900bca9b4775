"""Acknowledge first, answer later: new conversation work waits while events are being
acknowledged (bot.lark.intake.Intake.quiet, the dispatcher's admission), but never longer
than the hold bound. An acknowledgement is held in flight here by holding the database's
write lock, so its inbox commit cannot finish."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bot.delivery.dispatcher import Dispatcher
from bot.delivery.inbox_store import Inbox
from bot.lark.intake import Intake
from storage import Database
from storage.sqlite import SqliteDatabase
from tests.fakes.lark_events import make_text_event


@pytest.fixture
async def world(tmp_path):
    db = await SqliteDatabase(tmp_path / "ack.db").open()
    started: list[tuple[object, float]] = []

    async def handle(job) -> None:
        started.append((job, time.monotonic()))

    holder: dict = {}
    dispatcher = Dispatcher(handle, max_concurrency=8, admit=lambda: holder["intake"].quiet(holder["hold"]))
    intake = Intake(Inbox(db), dispatcher)
    holder.update(intake=intake, hold=0.4)
    yield db, dispatcher, intake, started
    await dispatcher.idle()
    await db.close()


async def _ack_in_flight(db: Database, intake: Intake, text: str):
    """An acknowledgement stuck at its inbox commit until the returned event is set."""
    release = asyncio.Event()
    locked = asyncio.Event()

    async def hold_lock() -> None:
        async with db.transaction():
            locked.set()
            await release.wait()

    holder = asyncio.create_task(hold_lock())
    await locked.wait()
    body = make_text_event(text, chat_id="oc_p2p_ack", sender="ou_ack")
    ack = asyncio.create_task(intake.accept(json.dumps(body), body))
    await asyncio.sleep(0.02)
    assert not ack.done()
    return release, ack, holder


async def test_work_waits_until_the_acknowledgements_are_done(world):
    db, dispatcher, intake, started = world
    release, ack, holder = await _ack_in_flight(db, intake, "hello")
    dispatcher.submit("oc_other", "earlier job")
    await asyncio.sleep(0.15)
    assert started == []                          # held while the acknowledgement is in flight
    release.set()
    result = await ack
    acked_at = time.monotonic()
    await holder
    assert result.status == "accepted"
    await dispatcher.idle()
    assert [job for job, _ in started][0] == "earlier job"
    assert all(at >= acked_at for _, at in started)


async def test_work_is_held_no_longer_than_the_bound(world):
    db, dispatcher, intake, started = world
    release, ack, holder = await _ack_in_flight(db, intake, "stuck")
    t0 = time.monotonic()
    dispatcher.submit("oc_other", "job")
    while not started and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.01)
    assert started and not ack.done()             # started although the ack is still in flight
    assert 0.3 <= started[0][1] - t0 < 2.0       # after the 0.4 s hold, not never
    release.set()
    await ack
    await holder


async def test_without_acknowledgements_work_starts_at_once(world):
    db, dispatcher, intake, started = world
    t0 = time.monotonic()
    dispatcher.submit("oc_other", "job")
    await dispatcher.idle()
    assert started and started[0][1] - t0 < 0.2
