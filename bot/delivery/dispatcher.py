"""One ordered mailbox per conversation; conversations run in parallel up to a bound.

Every task is owned: workers live in a set with a done-callback, so nothing is
fire-and-forget and shutdown can drain them. A mailbox's worker exits when its queue
is empty, which frees idle conversations without a sweeper.

Shutdown order (``stop``): stop intake → drain within the deadline → cancel the rest.
Work that was cancelled is still pending in the inbox and is answered on next start.

``on_idle(conv_key)``, when given, is asked for more work before a conversation's worker
exits (replicas: the conversation's lease holder answers what other replicas stored for it,
then releases the lease — bot/delivery/replicas.py).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Awaitable, Callable

from bot.infra.log import get_logger
from storage import is_database_error

log = get_logger("ethan.dispatch")

Handler = Callable[[Any], Awaitable[None]]


class Dispatcher:
    def __init__(self, handler: Handler, *, max_concurrency: int = 64,
                 admit: Callable[[], Awaitable[None]] | None = None,
                 on_idle: Callable[[str], Awaitable[list]] | None = None) -> None:
        self._handler = handler
        self._admit = admit   # waited before each job starts (the intake's "acknowledge first")
        self._on_idle = on_idle
        self._sem = asyncio.Semaphore(max_concurrency)
        self._mailboxes: dict[str, collections.deque] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self.handled = 0
        self.failed = 0

    @property
    def accepting(self) -> bool:
        return not self._closing

    @property
    def depth(self) -> int:
        return sum(len(q) for q in self._mailboxes.values()) + len(self._workers)

    @property
    def conversations(self) -> int:
        return len(self._mailboxes)

    def active(self, conv_key: str) -> bool:
        """A worker is on this conversation (its queued jobs will be answered in order)."""
        return conv_key in self._workers

    def submit(self, conv_key: str, job: Any) -> bool:
        """Queue ``job`` behind earlier jobs of the same conversation. False once closing."""
        if self._closing:
            return False
        box = self._mailboxes.get(conv_key)
        if box is None:
            box = self._mailboxes[conv_key] = collections.deque()
        box.append(job)
        if conv_key not in self._workers:
            task = asyncio.get_running_loop().create_task(self._drain(conv_key), name=f"conv:{conv_key}")
            self._workers[conv_key] = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    async def _drain(self, conv_key: str) -> None:
        box = self._mailboxes[conv_key]
        try:
            while True:
                if not box:
                    if self._on_idle is None or self._closing:
                        break
                    try:
                        more = await self._on_idle(conv_key)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:
                        if is_database_error(e):
                            # PostgreSQL restarting, SQLite's lock held: expected, and covered
                            # (the heartbeat releases what this worker no longer works).
                            log.warning("dispatch.idle_failed", conv_key=conv_key,
                                        error=f"{type(e).__name__}: {e}"[:200])
                        else:
                            log.exception("dispatch.idle_failed", conv_key=conv_key)
                        more = []
                    box.extend(more)
                    if not box:     # nothing more (a submit while on_idle ran lands in box)
                        break
                job = box[0]
                async with self._sem:
                    try:
                        if self._admit is not None:
                            await self._admit()
                        await self._handler(job)
                        self.handled += 1
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        self.failed += 1
                        log.exception("dispatch.job_failed", conv_key=conv_key)
                box.popleft()
        finally:
            # No await between the emptiness check and removal: atomic on the loop.
            self._workers.pop(conv_key, None)
            if not box:
                self._mailboxes.pop(conv_key, None)

    async def stop(self, deadline: float) -> int:
        """Stop intake, let in-flight work finish for up to ``deadline`` s, cancel the rest.

        Returns how many conversations were cancelled.
        """
        self._closing = True
        pending = set(self._tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=deadline)
        else:
            still = set()
        for t in still:
            t.cancel()
        if still:
            await asyncio.gather(*still, return_exceptions=True)
            log.warning("dispatch.cancelled", conversations=len(still))
        return len(still)

    async def idle(self) -> None:
        """Wait until every mailbox is empty (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
