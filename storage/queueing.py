"""Who goes first when units of work wait for the database.

An acknowledgement waits for its inbox commit, and Lark gives it 3 s (and a user sees nothing
of it); a reply's writes only add to a latency the user already waits seconds for. With one
FIFO in front of the database — SQLite's one writer, PostgreSQL's pool of connections — an
inbox commit queued behind a burst of replies' units made the acknowledgement's tail (issue 29:
webhook p99 91 ms, long connection 173 ms at 200 events/s, nearly all of it that wait).

:class:`PrioritySemaphore` is an asyncio semaphore with two queues: ``acquire(first=True)``
waiters are served before any ordinary waiter (FIFO within each queue). Nothing already
running is interrupted; an ordinary waiter waits at most for the urgent ones queued ahead of
it, which are few (one inbox commit at a time per process).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import AsyncIterator


class PrioritySemaphore:
    def __init__(self, value: int = 1) -> None:
        if value < 1:
            raise ValueError("value must be at least 1")
        self._value = value
        self._queues: tuple[collections.deque, collections.deque] = (collections.deque(), collections.deque())

    def locked(self) -> bool:
        """No permit is free (a caller of ``acquire`` would wait)."""
        return self._value == 0

    async def acquire(self, first: bool = False) -> None:
        if self._value > 0 and not (self._queues[0] or self._queues[1]):
            self._value -= 1
            return
        future = asyncio.get_running_loop().create_future()
        queue = self._queues[0 if first else 1]
        queue.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release()          # granted as the caller was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(future)
            raise

    def release(self) -> None:
        self._value += 1
        while self._value > 0:
            future = self._next()
            if future is None:
                return
            self._value -= 1
            future.set_result(None)

    def _next(self) -> asyncio.Future | None:
        for queue in self._queues:
            while queue:
                future = queue.popleft()
                if not future.done():           # a cancelled waiter left its future done
                    return future
        return None

    @contextlib.asynccontextmanager
    async def hold(self, first: bool = False) -> AsyncIterator[None]:
        await self.acquire(first)
        try:
            yield
        finally:
            self.release()
