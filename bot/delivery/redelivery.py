"""The redelivery policy: an acknowledged Lark event is answered, once — even when the first
attempt could not finish.

Lark got its 200 when the event was committed to the inbox (bot/delivery/inbox_store.py), so
nothing upstream will send it again: this module owns what happens when handling it fails.

- **A database error** (another process holding the write lock past the busy timeout, a full
  disk): handled again in this process after ``db_retry_delays_s`` (then every 30 s) until the
  30-minute rule; the user hears from us once it has taken ``db_notice_after_s``, and is told
  it was given up if it comes to that (issue 17). Stopping: the row stays pending for the next
  start.
- **An answer Lark did not take** (the Open API down, a token problem: the handler's
  ``retry_later``): submitted again after ``redeliver_after_s``.
- **Recovery at start**: what the last run acknowledged but did not answer (a shared database:
  only what no live replica works; bot/delivery/replicas.py takes the rest over as leases
  expire), and rows too old to answer marked so.
- **Housekeeping**: idle sessions closed, answered rows pruned (inbox, outbox).

While a retry timer waits, its row stays this replica's (the heartbeat renews it): ``waiting``
tells the replicas' poll not to submit it twice. Timers die with the process; the row is
pending in the inbox, so a restart picks it up too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Awaitable, Callable

from bot.delivery.inbox_store import STALE_SECONDS, Inbox, InboxItem
from bot.core.handler import DirectJob
from bot.infra.log import get_logger
from bot.core.text import is_chinese
from storage import is_database_error

log = get_logger("ethan.app")

REDELIVER_AFTER_S = 60.0   # an answer Lark did not take (the Open API down, a token problem) is tried again
DB_RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
DB_NOTICE_AFTER_S = 10.0
DB_NOTICE = {"zh": "我这边的存储暂时出了点问题，正在重试，稍后回复你。",
             "en": "My storage is having trouble right now; I'm retrying and will answer shortly."}
DB_GAVE_UP = {"zh": "抱歉，存储出错，这条消息没能处理，请再发一次。",
              "en": "Sorry — a storage error kept me from handling this message; please send it again."}
HOUSEKEEPING_S = 300.0


class Redelivery:
    """What the dispatcher runs for every job: the handler, with the retries above.

    Wired after construction (the composition root builds the handler and the dispatcher
    around it): ``handler``, ``dispatcher``, ``replicas`` (a shared database) and ``sender``
    (Lark connected: the user notices) are plain attributes."""

    def __init__(self, inbox: Inbox, *, closing: Callable[[], bool],
                 spawn: Callable[[Awaitable, str], object]) -> None:
        self.inbox = inbox
        self._closing = closing
        self._spawn = spawn
        self.handler: Callable[[InboxItem | DirectJob], Awaitable[None]] | None = None
        self.dispatcher = None          # bot.delivery.dispatcher.Dispatcher
        self.replicas = None            # bot.delivery.replicas.Replicas (a shared database)
        self.sender = None              # bot.lark.outbound.LarkSender (Lark connected)
        # Whether the item's message is in a thread (the notice goes there too): the transport's
        # decoded event, set by the composition root (this package knows no transport).
        self.in_thread: Callable[[InboxItem], bool] = lambda item: False
        self.redeliver_after_s = REDELIVER_AFTER_S
        self.db_retry_delays_s = DB_RETRY_DELAYS_S
        self.db_notice_after_s = DB_NOTICE_AFTER_S
        self._db_failures: dict[int, list] = {}    # inbox id -> [first failure (monotonic), attempts, told]
        self.waiting: set[int] = set()             # inbox ids a retry timer will submit again
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def stopped(self) -> bool:
        return self._closing() or self.dispatcher is None

    async def handle(self, item: InboxItem | DirectJob) -> None:
        """The handler, with database errors retried in this process (issue 17): the message
        was acknowledged, so it must not wait silently for a restart that may come too late.
        A waiting interface's message (DirectJob) was not acknowledged early: its caller hears
        the error instead (bot/delivery/direct.py)."""
        if isinstance(item, DirectJob):
            await self.handler(item)
            return
        if self.replicas is None:
            await self._handle_item(item)
            return
        try:
            await self.replicas.handle(item, self._handle_item)
        except Exception as e:
            if not is_database_error(e):
                raise
            self._database_retry(item, e)    # claiming its conversation failed: as any DB error

    async def _handle_item(self, item: InboxItem) -> None:
        try:
            await self.handler(item)
        except Exception as e:
            if not is_database_error(e):
                raise
            self._database_retry(item, e)
            return
        state = self._db_failures.pop(item.id, None)
        if state is not None:
            log.info("handle.db_recovered", event_id=item.event_id, message_id=item.message_id or "",
                     chat_id=item.chat_id, inbox_id=item.id, attempts=state[1],
                     after_s=round(time.monotonic() - state[0], 1))

    def _database_retry(self, item: InboxItem, error: Exception) -> None:
        now = time.monotonic()
        state = self._db_failures.setdefault(item.id, [now, 0, False])
        state[1] += 1
        delays = self.db_retry_delays_s
        delay = delays[min(state[1], len(delays)) - 1]
        bound = log.bind(event_id=item.event_id, message_id=item.message_id or "", chat_id=item.chat_id,
                         inbox_id=item.id)
        detail = f"{type(error).__name__}: {error}"[:200]
        if self.stopped:
            # Stays pending in the inbox: the next start answers it (if within 30 minutes).
            bound.warning("handle.db_error", error=detail, attempt=state[1], retry_in_s=None, inbox="pending")
            self._db_failures.pop(item.id, None)
            return
        if time.time() - item.create_time + delay > STALE_SECONDS:
            # The 30-minute rule ends it: say so, never drop it silently.
            self._db_failures.pop(item.id, None)
            bound.error("handle.db_gave_up", error=detail, attempts=state[1],
                        after_s=round(now - state[0], 1))
            self._spawn(self.tell(item, DB_GAVE_UP, "dbfail", finish=True), "db-gave-up")
            return
        bound.warning("handle.db_error", error=detail, attempt=state[1], retry_in_s=delay, inbox="pending")
        if not state[2] and now - state[0] + delay >= self.db_notice_after_s:
            state[2] = True
            self._spawn(self.tell(item, DB_NOTICE, "dbwait"), "db-notice")
        self._submit_later(item, delay)

    async def tell(self, item: InboxItem, texts: dict, tag: str, *, finish: bool = False) -> None:
        """A short word to the user about their message, outside the normal reply (its uuid is
        derived from the message, so a second notice is never shown twice)."""
        bound = log.bind(event_id=item.event_id, message_id=item.message_id or "", chat_id=item.chat_id)
        text = texts["zh" if is_chinese(item.payload) else "en"]
        try:
            if item.message_id and self.sender is not None:
                try:
                    thread = self.in_thread(item)
                except (ValueError, RecursionError):
                    thread = False
                await self.sender.reply(item.message_id, "text", {"text": text}, uuid=f"r-{item.message_id}-{tag}",
                                        chat_id=item.chat_id, in_thread=thread)
                bound.info("handle.user_told", notice=tag)
            # else: no Lark transport (an item an earlier Lark-connected run left): nobody to tell
        except Exception as e:  # noqa: BLE001 - the notice is best effort; the retry goes on
            bound.warning("handle.user_not_told", notice=tag, error=str(e)[:200])
        if finish:
            try:
                await self.inbox.finish(item.id, "failed", "database error for 30 minutes")
            except Exception:  # noqa: BLE001 - still failing: the next start marks it stale
                pass

    def retry_later(self, item: InboxItem) -> float | None:
        """Submit an undelivered item again after ``redeliver_after_s`` (the handler's skip
        rule ends it once the message is 30 minutes old). Timers die with the process; the
        row is pending in the inbox, so a restart picks it up too."""
        if self.stopped:
            return None
        self._submit_later(item, self.redeliver_after_s)
        return self.redeliver_after_s

    def _submit_later(self, item: InboxItem, delay: float) -> None:
        """The row stays this replica's meanwhile (the heartbeat renews it), so no other replica
        answers it early; its conversation is claimed again when it runs."""
        again = dataclasses.replace(item, attempts=item.attempts + 1, held=False)
        self.waiting.add(item.id)

        def resubmit() -> None:
            self._timers.discard(handle)
            self.waiting.discard(item.id)
            if not self.stopped:
                self.dispatcher.submit(again.conv_key, again)

        handle = asyncio.get_running_loop().call_later(delay, resubmit)
        self._timers.add(handle)

    async def recover(self) -> None:
        """At start: answer what was acknowledged but not answered before the last stop."""
        expired = await self.inbox.expire_stale()
        if self.replicas is not None:
            # A shared database: only what nobody alive works (unowned, expired, or this
            # replica's own under a fixed ETHAN_REPLICA_ID); the poll takes the rest over as
            # leases expire.
            answering = await self.replicas.take_over(own=True)
        else:
            # One process per SQLite file: everything pending is this process's to answer.
            await self.inbox.adopt_pending()
            pending = await self.inbox.pending()
            for item in pending:
                self.dispatcher.submit(item.conv_key, item)
            answering = len(pending)
        if answering or expired:
            log.info("inbox.recovered", answering=answering, too_old=expired, replica=self.inbox.owner)

    async def housekeeping(self, *, close_idle: Callable[[], Awaitable[None]], outbox) -> None:
        """Every few minutes: idle sessions closed (``close_idle``), answered rows pruned."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            try:
                await close_idle()
                await self.inbox.prune()
                await outbox.prune()
            except Exception:  # noqa: BLE001
                log.exception("housekeeping.failed")

    def stop(self) -> None:
        """The retry timers end; their items stay pending in the inbox."""
        for timer in list(self._timers):
            timer.cancel()
        self._timers.clear()
        self.waiting.clear()
