"""Token buckets, one per key (a chat, a card), for outbound Lark calls.

Lark allows 5 messages per second to one user or one group (DESIGN §5), and
CardKit 10 operations per second on one card entity. A ``KeyedRateLimiter``
spaces calls per key under such a limit: ``await limiter.acquire(key)`` returns
when the call may go.

The bucket is reservation-based: taking a token may drive the balance negative,
and the caller sleeps until its reservation matures. Concurrent callers on the
same key are therefore served first come, first served, without polling loops.

With ``burst=1`` (the default) calls are evenly spaced ``1/rate`` apart, so no
one-second window ever holds more than ``rate`` calls — the strict reading of
"5 QPS per chat". A bucket that has refilled completely is indistinguishable
from a new one, so idle buckets are dropped and the map stays as small as the
set of chats currently talking.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Hashable

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass
class TokenBucket:
    """A bucket holding up to ``burst`` tokens, refilled at ``rate`` per second."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> "TokenBucket":
        return cls(rate=rate, burst=burst, tokens=burst, updated=now)

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def reserve(self, now: float) -> float:
        """Take one token; return how long to wait before using it (0 = now)."""
        self._refill(now)
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate

    def idle(self, now: float) -> bool:
        """True when the bucket is full again (no reservation outstanding)."""
        self._refill(now)
        return self.tokens >= self.burst


class KeyedRateLimiter:
    """One ``TokenBucket`` per key; idle buckets are freed."""

    def __init__(
        self,
        rate: float,
        *,
        burst: float = 1.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        sweep_every: int = 256,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        if burst < 1:
            raise ValueError("burst must be at least 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._sweep_every = max(1, sweep_every)
        self._since_sweep = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def reserve(self, key: Hashable) -> float:
        """Reserve a slot for ``key``; return the wait in seconds (0 = go now)."""
        now = self._clock()
        self._since_sweep += 1
        if self._since_sweep >= self._sweep_every:
            self.sweep(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket.full(self.rate, self.burst, now)
        return bucket.reserve(now)

    async def acquire(self, key: Hashable) -> float:
        """Wait for a slot for ``key``; return the time waited."""
        wait = self.reserve(key)
        if wait > 0:
            await self._sleep(wait)
        return wait

    def sweep(self, now: float | None = None) -> int:
        """Drop buckets that are full again; return how many were dropped."""
        now = self._clock() if now is None else now
        self._since_sweep = 0
        idle = [k for k, b in self._buckets.items() if b.idle(now)]
        for k in idle:
            del self._buckets[k]
        return len(idle)
