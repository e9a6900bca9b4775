"""Per-conversation mailboxes: order within a conversation, parallelism across them."""

from __future__ import annotations

import asyncio

from bot.delivery.dispatcher import Dispatcher


async def test_order_within_conversation_and_parallel_across():
    log: list[tuple[str, int]] = []
    gate = asyncio.Event()

    async def handle(job):
        conv, i, slow = job
        if slow:
            await gate.wait()
        log.append((conv, i))

    d = Dispatcher(handle, max_concurrency=8)
    d.submit("slow", ("slow", 0, True))
    for i in range(5):
        d.submit("a", ("a", i, False))
    for i in range(1, 3):
        d.submit("slow", ("slow", i, False))
    await asyncio.sleep(0.05)
    assert [x for x in log if x[0] == "a"] == [("a", i) for i in range(5)]   # not held up
    assert not [x for x in log if x[0] == "slow"]                             # still ordered behind 0
    gate.set()
    await d.idle()
    assert [x for x in log if x[0] == "slow"] == [("slow", 0), ("slow", 1), ("slow", 2)]
    assert d.conversations == 0        # idle mailboxes are freed


async def test_failure_does_not_stop_the_mailbox():
    seen = []

    async def handle(job):
        if job == 1:
            raise RuntimeError("boom")
        seen.append(job)

    d = Dispatcher(handle)
    for j in range(3):
        d.submit("c", j)
    await d.idle()
    assert seen == [0, 2] and d.failed == 1


async def test_stop_refuses_intake_drains_then_cancels():
    finished = []

    async def handle(job):
        await asyncio.sleep(job)
        finished.append(job)

    d = Dispatcher(handle)
    d.submit("quick", 0.01)
    d.submit("stuck", 30)
    cancelled = await d.stop(deadline=0.3)
    assert finished == [0.01] and cancelled == 1
    assert d.submit("late", 0) is False


async def test_concurrency_bound():
    running, peak = 0, 0

    async def handle(job):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1

    d = Dispatcher(handle, max_concurrency=3)
    for i in range(20):
        d.submit(f"c{i}", i)
    await d.idle()
    assert peak == 3
