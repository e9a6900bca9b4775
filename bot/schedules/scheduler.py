"""The scheduler: one task that sends reminders when they are due (memory/schedules/store.py).

It sleeps until the earliest due time the store knows (not a poll; at most ``max_sleep``, so
a job another replica stored, or a claim another replica let lapse, is seen within it) and is
woken at once when this process stores or cancels a job (``wake``). Due jobs are claimed with
a lease and delivered in tasks of their own (a model-written one does not hold up the rest).

Per occurrence (docs/reliability.md "Reminders"):
- on time (within ``LATE_AFTER_S``): sent, recorded ``sent``;
- late (Ethan was down at the due time) but within the grace window: sent once, marked with
  the time it was due, recorded ``late``;
- past the grace window: not sent, recorded ``skipped`` (``/reminders`` lists it) — and the
  job moves on to its next occurrence after now;
- the chat is gone for the bot (removed from it, user gone, permission refused): the job is
  stopped and logged once, never retried;
- a transient failure (Lark down past the sender's own retries): the claim is kept until its
  lease runs out, then the occurrence is tried again — with the same Lark uuid (the job id and
  the occurrence), so a send that did reach Lark is not shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Awaitable, Callable, Protocol

from bot.infra.log import get_logger
from memory.sessions.chat_events import has_left
from memory.schedules.recurrence import local_iso
from memory.schedules.store import Schedule, ScheduleStore

log = get_logger("ethan.scheduler")
LATE_AFTER_S = 60.0          # sent more than this after its due time: marked late
MAX_SLEEP_S = 30.0
CONCURRENT_SENDS = 16


class Undeliverable(Exception):
    """The chat cannot be sent to any more (the job is stopped, not retried)."""


class Deliver(Protocol):
    async def __call__(self, job: Schedule, text: str, uuid: str) -> str: ...


def occurrence_uuid(job_id: int, due_at: float) -> str:
    """Lark's idempotency key of one occurrence: a retried send of it is deduplicated."""
    return f"rem-{job_id}-{int(round(due_at))}"


def late_note(job: Schedule, due_at: float, zh: bool) -> str:
    due = local_iso(due_at, job.tz)
    return f"（迟到的提醒，原定 {due}）" if zh else f"(Late reminder — it was due {due}.)"


class Scheduler:
    def __init__(self, store: ScheduleStore, deliver: Deliver, *,
                 compose: Callable[[Schedule], Awaitable[str]] | None = None,
                 clock: Callable[[], float] = time.time, grace_s: float = 6 * 3600,
                 max_sleep: float = MAX_SLEEP_S, batch: int = 200,
                 is_chinese: Callable[[str], bool] = lambda s: any("\u4e00" <= c <= "\u9fff" for c in s),
                 on_sent: Callable[[float], None] | None = None) -> None:
        self.store = store
        self.deliver = deliver
        self.compose = compose
        self.clock = clock
        self.grace_s = float(grace_s)
        self.max_sleep = float(max_sleep)
        self.batch = batch
        self.is_chinese = is_chinese
        self.on_sent = on_sent           # seconds from due to the send request (metrics, bench)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._sends: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(CONCURRENT_SENDS)
        self.ticks = 0
        self.started_at = 0.0

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self.started_at = self.clock()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        """The loop first (no new claims), then the sends in flight; their claims go back."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for t in list(self._sends):
            t.cancel()
        await asyncio.gather(*self._sends, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.store.release_all()

    def wake(self) -> None:
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()        # before reading: a wake during the tick is not lost
            delay = self.max_sleep
            try:
                await self.tick()
                nxt = await self.store.next_wake(self.clock())
                if nxt is not None:
                    delay = min(self.max_sleep, max(0.0, nxt - self.clock()))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the database away: try again shortly
                log.warning("scheduler.tick_failed", error=str(e)[:300])
                delay = min(self.max_sleep, 5.0)
            if delay > 0:
                with contextlib.suppress(TimeoutError):     # asyncio.timeout: a cancel is never lost
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    async def tick(self) -> int:
        """Claim what is due and start its deliveries; the number claimed."""
        self.ticks += 1
        jobs = await self.store.claim_due(limit=self.batch)
        for job in jobs:
            t = asyncio.get_running_loop().create_task(self._guarded(job), name=f"reminder-{job.id}")
            self._sends.add(t)
            t.add_done_callback(self._sends.discard)
        return len(jobs)

    async def idle(self) -> None:
        """Until every delivery started so far has finished (tests, bench)."""
        while self._sends:
            await asyncio.gather(*list(self._sends), return_exceptions=True)

    async def _guarded(self, job: Schedule) -> None:
        async with self._slots:
            try:
                await self.occurrence(job)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the claim lapses and the occurrence is retried
                log.warning("reminder.send_failed", schedule_id=job.id, chat_id=job.chat_id,
                            user_id=job.owner_id, due_at=job.next_due, error=str(e)[:300])

    async def occurrence(self, job: Schedule) -> None:
        due = job.next_due
        assert due is not None
        now = self.clock()
        ids = dict(schedule_id=job.id, chat_id=job.chat_id, user_id=job.owner_id, due_at=due)
        if now - due > self.grace_s:
            await self.store.finish(job, due, "skipped", skip_until=now - self.grace_s,
                                    detail=f"Ethan was not running; {int((now - due) // 60)} min past due")
            log.warning("reminder.skipped", late_s=round(now - due, 1), grace_s=self.grace_s, **ids)
            return
        # Late: due before this process's scheduler was running (Ethan was down), or held up
        # well past its time (the database or Lark away).
        late = (due < self.started_at - 1.0) or now - due > LATE_AFTER_S
        text = job.text
        if job.use_model and self.compose is not None:
            try:
                text = await self.compose(job)
            except Exception as e:  # noqa: BLE001 - the stored text is still worth sending
                log.warning("reminder.compose_failed", error=str(e)[:200], **ids)
        if late:
            text = f"{text}\n{late_note(job, due, self.is_chinese(job.text))}"
        uuid = occurrence_uuid(job.id, due)
        try:
            if self.on_sent is not None:
                self.on_sent(self.clock() - due)
            mid = await self.deliver(job, text, uuid)
        except Undeliverable as e:
            await self.store.give_up(job, due, str(e))
            log.warning("reminder.stopped", reason=str(e)[:200], **ids)
            return
        recorded = await self.store.finish(job, due, "late" if late else "sent", lark_message_id=mid,
                                           detail=f"due {local_iso(due, job.tz)}" if late else "")
        log.info("reminder.sent", late=late, late_s=round(now - due, 3), uuid=uuid, message_id=mid,
                 recorded=recorded, **ids)


def mention(job: Schedule, text: str) -> str:
    """A group reminder @-mentions its owner (Lark text's <at> tag)."""
    if job.chat_type != "group":
        return text
    return f'<at user_id="{job.owner_id}"></at> {text}'


class LarkDelivery:
    """Sends an occurrence as a new message (not a reply) in the chat where it was set."""

    def __init__(self, sender: Any, db: Any) -> None:
        self.sender = sender        # bot.lark.outbound.sender.LarkSender
        self.db = db

    async def __call__(self, job: Schedule, text: str, uuid: str) -> str:
        from bot.lark.openapi.client import Category, LarkApiError
        from bot.lark.outbound.render import defuse_mentions

        if await has_left(self.db, job.chat_id):
            raise Undeliverable("the bot was removed from the chat")
        try:
            # The text is the user's or the model's: its <at> tags are made inert, as in every
            # answer (only the owner's mention, added by the product, is real).
            return await self.sender.send(job.chat_id, "text", {"text": mention(job, defuse_mentions(text))},
                                          uuid=uuid)
        except LarkApiError as e:
            if e.category in (Category.PERMISSION, Category.BAD_REQUEST, Category.GONE):
                raise Undeliverable(f"Lark refused the chat: code {e.code} ({e.category.value})") from e
            raise
