"""A chat's mode (``group`` | ``topic`` | ``p2p``), looked up once per chat and cached.

Why: topic-mode groups (话题群) deliver a topic's replies with ``root_id`` but no
``thread_id``; only the chat's mode (get-chat API: ``chat_mode`` "topic", or
``group_message_type`` "thread") says that ``root_id`` names a topic — in an ordinary group
a reply also carries ``root_id`` and stays in the group's one conversation. Asked only for
such group messages, so most messages cost nothing. Scope: ``im:chat:readonly`` (or
``im:chat``); without it one log line names the scope and the group is one conversation.
"""

from __future__ import annotations

import time

from bot.lark.openapi.client import Category, LarkApiError, OpenApi
from bot.infra.log import get_logger

log = get_logger("ethan.lark.chats")

TTL_S = 3600.0
MAX_CHATS = 10_000


class CachedChatModes:
    def __init__(self, api: OpenApi | None, *, ttl: float = TTL_S) -> None:
        self.api = api
        self.ttl = ttl
        self._cache: dict[str, tuple[str, float]] = {}
        self._said_scope = False

    async def is_topic_chat(self, chat_id: str) -> bool:
        hit = self._cache.get(chat_id)
        if hit and hit[1] > time.monotonic():
            return hit[0] == "topic"
        mode = await self._lookup(chat_id)
        if len(self._cache) >= MAX_CHATS:
            self._cache.clear()
        self._cache[chat_id] = (mode, time.monotonic() + self.ttl)
        return mode == "topic"

    async def _lookup(self, chat_id: str) -> str:
        if self.api is None:
            return "group"
        try:
            data = await self.api.request("GET", f"/open-apis/im/v1/chats/{chat_id}")
        except LarkApiError as e:
            if e.category is Category.PERMISSION and not self._said_scope:
                self._said_scope = True
                log.warning("chat.mode_unknown", chat_id=chat_id, missing_scope="im:chat:readonly",
                            **e.log_fields())
            elif e.category is not Category.PERMISSION:
                log.info("chat.mode_unknown", chat_id=chat_id, **e.log_fields())
            return "group"
        if (data or {}).get("chat_mode") == "topic" or (data or {}).get("group_message_type") == "thread":
            return "topic"
        return str((data or {}).get("chat_mode") or "group")
