"""Display names for group speakers, looked up once and cached.

FeishuChannel looks up every inbound sender through the contact API (DESIGN.md §5 cost
trap). Here a name is fetched at most once per TTL, only for group speakers (their turns
are labelled in the hot zone), and a failure (missing contact scope, user left) falls
back to a short form of the open_id rather than failing the reply.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from bot.infra.log import get_logger

log = get_logger("ethan.names")


class CachedNames:
    def __init__(self, api, *, ttl: float = 24 * 3600, max_size: int = 5000) -> None:
        self.api = api
        self.ttl = ttl
        self.max_size = max_size
        self._cache: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future] = {}
        self.lookups = 0

    def remember(self, open_id: str, name: str) -> None:
        """Names Lark already sent us (mentions) cost nothing."""
        if open_id and name:
            self._put(open_id, name)

    async def name(self, open_id: str) -> str:
        hit = self._cache.get(open_id)
        if hit and hit[1] > time.monotonic():
            self._cache.move_to_end(open_id)
            return hit[0]
        fut = self._inflight.get(open_id)
        if fut is not None:
            return await fut
        fut = asyncio.get_running_loop().create_future()
        self._inflight[open_id] = fut
        try:
            name = await self._lookup(open_id)
            self._put(open_id, name)
            fut.set_result(name)
            return name
        finally:
            self._inflight.pop(open_id, None)
            if not fut.done():
                fut.set_result(fallback(open_id))

    async def known_name(self, open_id: str) -> str:
        """The user's real name, "" when only the id-tail fallback is known (no contact scope)."""
        name = await self.name(open_id)
        return "" if name == fallback(open_id) else name

    async def _lookup(self, open_id: str) -> str:
        if self.api is None:   # console only: no Lark to ask
            return fallback(open_id)
        self.lookups += 1
        try:
            data = await self.api.request(
                "GET", f"/open-apis/contact/v3/users/{open_id}", params={"user_id_type": "open_id"})
            user = (data or {}).get("user") or {}
            return user.get("name") or user.get("en_name") or fallback(open_id)
        except Exception as e:  # noqa: BLE001 — a name is never worth failing a reply
            log.info("names.lookup_failed", open_id=open_id, error=str(e)[:200])
            return fallback(open_id)

    def _put(self, open_id: str, name: str) -> None:
        self._cache[open_id] = (name, time.monotonic() + self.ttl)
        self._cache.move_to_end(open_id)
        while len(self._cache) > self.max_size:
            self._cache.popitem(last=False)


def fallback(open_id: str) -> str:
    return f"user-{open_id[-6:]}" if open_id else "someone"
