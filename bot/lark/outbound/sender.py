"""Outbound Open API calls: replies, reactions, CardKit cards — retried, never doubled.

``LarkSender`` makes the Open API calls the bot needs. Every message send waits on
a per-chat token bucket (5 per second, DESIGN §5) and is retried by the
classification table in ``bot.lark.openapi.client``:

- rate limited (HTTP 429, 99991400, 230020): wait ``x-ogw-ratelimit-reset`` (or back
  off) and resend with the same ``uuid`` — Lark deduplicates by uuid for an hour,
  so a retried send is never doubled;
- transient (network, 5xx, Open API down): exponential backoff, same ``uuid``, until
  ``max_attempts`` or the time budget (default 90 s: an Open API outage of a minute
  still delivers) runs out;
- reply target gone (the user recalled the message): a fresh message to the chat,
  with a uuid derived from the original;
- anything else: no retry. A reply that finally fails is logged as ``reply.failed``
  with chat id, message id, Lark code and log id.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import structlog

from bot.lark.outbound.cards import card_entity_body
from bot.lark.openapi.client import LarkApiError, OpenApi
from bot.lark.outbound.ratelimit import KeyedRateLimiter
from bot.lark.outbound.render import derive_uuid




@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one call. Delays: ``base_delay * 2**(n-1)`` capped at ``max_delay``,
    ± ``jitter``; a server-given delay wins (capped at ``max_retry_after``). The call gives
    up after ``max_attempts`` or when the next wait would pass ``budget_s``."""

    max_attempts: int = 10
    base_delay: float = 0.5
    max_delay: float = 20.0
    budget_s: float = 90.0
    max_retry_after: float = 60.0
    jitter: float = 0.2

    def backoff(self, attempt: int, rnd: float) -> float:
        delay = min(self.max_delay, self.base_delay * (2 ** max(0, attempt - 1)))
        return max(0.0, delay * (1.0 + self.jitter * (2.0 * rnd - 1.0)))


CARD_POLICY = RetryPolicy(max_attempts=3, base_delay=0.3, max_delay=2.0, budget_s=8.0, max_retry_after=5.0)
REACTION_POLICY = RetryPolicy(max_attempts=2, base_delay=0.3, max_delay=1.0, budget_s=4.0, max_retry_after=2.0)


def _path_id(value: str) -> str:
    return quote(str(value), safe="")


class LarkSender:
    """Retried, rate-limited Open API calls for messages, reactions and CardKit cards."""

    def __init__(
        self,
        api: OpenApi,
        *,
        per_chat_qps: float = 5.0,
        per_card_qps: float = 8.0,
        rate_margin: float = 0.1,
        max_attempts: int = 10,
        base_delay: float = 0.5,
        max_delay: float = 20.0,
        budget_s: float = 90.0,
        max_retry_after: float = 60.0,
        jitter: float = 0.2,
        card_policy: RetryPolicy = CARD_POLICY,
        reaction_policy: RetryPolicy = REACTION_POLICY,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        random_: Callable[[], float] = random.random,
        log=None,
    ) -> None:
        self.api = api
        self.policy = RetryPolicy(
            max_attempts=max_attempts, base_delay=base_delay, max_delay=max_delay,
            budget_s=budget_s, max_retry_after=max_retry_after, jitter=jitter,
        )
        self.card_policy = card_policy
        self.reaction_policy = reaction_policy
        self._clock = clock
        self._sleep = sleep
        self._random = random_
        self._log = log or structlog.get_logger("ethan.lark")
        # Space sends a little under the limit (``rate_margin``) so network jitter between
        # us and Lark's counters never makes 5 sends look like 6 within one second.
        keep = max(0.0, min(0.5, rate_margin))
        self.chat_limiter = KeyedRateLimiter(per_chat_qps * (1 - keep), burst=1, clock=clock, sleep=sleep)
        self.card_limiter = KeyedRateLimiter(per_card_qps * (1 - keep), burst=1, clock=clock, sleep=sleep)

    # ---- the retry loop ------------------------------------------------------------------
    async def _call(
        self,
        op: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict | None = None,
        policy: RetryPolicy,
        limiter: KeyedRateLimiter | None = None,
        key: str | None = None,
        ctx: dict[str, Any],
    ) -> dict:
        started = self._clock()
        attempt = 0
        while True:
            attempt += 1
            if limiter is not None and key:
                await limiter.acquire(key)
            try:
                return await self.api.request(method, path, json=body, params=params)
            except LarkApiError as e:
                decision = e.decision
                if not decision.retry:
                    raise
                if attempt >= policy.max_attempts:
                    self._log.warning("lark.send.gave_up", op=op, reason="attempts", attempts=attempt,
                                      **ctx, **e.log_fields())
                    raise
                if decision.honour_retry_after and e.retry_after_s is not None:
                    delay = min(e.retry_after_s, policy.max_retry_after)
                    if delay <= 0:
                        delay = policy.backoff(1, self._random())
                else:
                    delay = policy.backoff(attempt, self._random())
                elapsed = self._clock() - started
                if elapsed + delay > policy.budget_s:
                    self._log.warning("lark.send.gave_up", op=op, reason="budget", attempts=attempt,
                                      elapsed_s=round(elapsed, 3), **ctx, **e.log_fields())
                    raise
                self._log.warning("lark.send.retry", op=op, attempt=attempt, delay_s=round(delay, 3),
                                  **ctx, **e.log_fields())
                await self._sleep(delay)

    # ---- messages ------------------------------------------------------------------------
    async def reply(
        self,
        message_id: str,
        msg_type: str,
        content: dict,
        *,
        uuid: str,
        chat_id: str,
        in_thread: bool = False,
    ) -> str:
        """Reply to ``message_id``; return the new message id.

        If the target was recalled or deleted, the answer goes to ``chat_id`` as a
        fresh message (uuid ``<uuid>-fresh``). Raises ``LarkApiError`` when it could
        not be delivered, after logging ``reply.failed``.
        """
        ctx = {"chat_id": chat_id, "message_id": message_id, "uuid": uuid, "msg_type": msg_type}
        body: dict[str, Any] = {
            "content": json.dumps(content, ensure_ascii=False),
            "msg_type": msg_type,
            "uuid": uuid,
        }
        if in_thread:
            body["reply_in_thread"] = True
        try:
            data = await self._call(
                "reply", "POST", f"/open-apis/im/v1/messages/{_path_id(message_id)}/reply",
                body=body, policy=self.policy, limiter=self.chat_limiter, key=chat_id or message_id, ctx=ctx,
            )
            return str(data.get("message_id") or "")
        except LarkApiError as e:
            if e.decision.fresh_send and chat_id:
                fresh = derive_uuid(uuid, "fresh")
                self._log.info("lark.reply.target_gone", fresh_uuid=fresh, **ctx, **e.log_fields())
                try:
                    return await self._create(chat_id, msg_type, content, uuid=fresh, ctx={**ctx, "uuid": fresh})
                except LarkApiError as e2:
                    self._log.error("reply.failed", fallback="fresh_send", **{**ctx, "uuid": fresh},
                                    **e2.log_fields())
                    raise
            self._log.error("reply.failed", **ctx, **e.log_fields())
            raise

    async def send(self, chat_id: str, msg_type: str, content: dict, *, uuid: str) -> str:
        """A new message in ``chat_id``; return its message id."""
        ctx = {"chat_id": chat_id, "uuid": uuid, "msg_type": msg_type}
        try:
            return await self._create(chat_id, msg_type, content, uuid=uuid, ctx=ctx)
        except LarkApiError as e:
            self._log.error("send.failed", **ctx, **e.log_fields())
            raise

    async def _create(self, chat_id: str, msg_type: str, content: dict, *, uuid: str, ctx: dict) -> str:
        body = {
            "receive_id": chat_id,
            "msg_type": msg_type,
            "content": json.dumps(content, ensure_ascii=False),
            "uuid": uuid,
        }
        data = await self._call(
            "send", "POST", "/open-apis/im/v1/messages", body=body, params={"receive_id_type": "chat_id"},
            policy=self.policy, limiter=self.chat_limiter, key=chat_id, ctx=ctx,
        )
        return str(data.get("message_id") or "")

    # ---- reactions -----------------------------------------------------------------------
    async def add_reaction(self, message_id: str, emoji: str = "Typing") -> str:
        """Add a reaction (an ``emoji_type`` such as ``Typing``, ``OK``, ``DONE``); return its id."""
        data = await self._call(
            "add_reaction", "POST", f"/open-apis/im/v1/messages/{_path_id(message_id)}/reactions",
            body={"reaction_type": {"emoji_type": emoji}}, policy=self.reaction_policy,
            ctx={"message_id": message_id, "emoji": emoji},
        )
        return str(data.get("reaction_id") or "")

    async def remove_reaction(self, message_id: str, reaction_id: str) -> None:
        await self._call(
            "remove_reaction", "DELETE",
            f"/open-apis/im/v1/messages/{_path_id(message_id)}/reactions/{_path_id(reaction_id)}",
            policy=self.reaction_policy, ctx={"message_id": message_id},
        )

    # ---- CardKit -------------------------------------------------------------------------
    async def create_card(self, card_json: dict) -> str:
        """Create a card entity; return its ``card_id``."""
        data = await self._call(
            "create_card", "POST", "/open-apis/cardkit/v1/cards", body=card_entity_body(card_json),
            policy=self.card_policy, ctx={},
        )
        card_id = str(data.get("card_id") or "")
        if not card_id:
            raise LarkApiError(-1, "create card: no card_id in response", http_status=200,
                               path="/open-apis/cardkit/v1/cards")
        return card_id

    async def stream_card_text(
        self, card_id: str, element_id: str, text: str, sequence: int, uuid: str | None = None
    ) -> None:
        """Set the full text of a streaming element (typewriter effect on the new suffix)."""
        await self._card_op(
            "stream_card", "PUT",
            f"/open-apis/cardkit/v1/cards/{_path_id(card_id)}/elements/{_path_id(element_id)}/content",
            {"content": text}, card_id=card_id, sequence=sequence, uuid=uuid,
        )

    async def close_streaming(
        self, card_id: str, sequence: int, *, settings: dict | None = None, uuid: str | None = None
    ) -> None:
        """Turn the card's streaming mode off (``settings`` may also set the summary)."""
        await self._card_settings("close_streaming", card_id, sequence,
                                  settings or {"config": {"streaming_mode": False}}, uuid)

    async def open_streaming(self, card_id: str, sequence: int, *, uuid: str | None = None) -> None:
        """Turn the card's streaming mode (back) on, e.g. for a card adopted after a crash."""
        await self._card_settings("open_streaming", card_id, sequence, {"config": {"streaming_mode": True}}, uuid)

    async def _card_settings(self, name: str, card_id: str, sequence: int, settings: dict,
                             uuid: str | None) -> None:
        await self._card_op(
            name, "PATCH", f"/open-apis/cardkit/v1/cards/{_path_id(card_id)}/settings",
            {"settings": json.dumps(settings, ensure_ascii=False)}, card_id=card_id, sequence=sequence,
            uuid=uuid,
        )

    async def update_card(self, card_id: str, card_json: dict, sequence: int, uuid: str | None = None) -> None:
        """Replace the whole card entity."""
        await self._card_op(
            "update_card", "PUT", f"/open-apis/cardkit/v1/cards/{_path_id(card_id)}",
            {"card": card_entity_body(card_json)}, card_id=card_id, sequence=sequence, uuid=uuid,
        )

    async def _card_op(self, name: str, method: str, path: str, body: dict[str, Any], *,
                       card_id: str, sequence: int, uuid: str | None) -> None:
        """One sequenced CardKit operation, under the per-card rate limit."""
        body = {**body, "sequence": sequence}
        if uuid:
            body["uuid"] = uuid
        await self._call(name, method, path, body=body, policy=self.card_policy,
                         limiter=self.card_limiter, key=card_id,
                         ctx={"card_id": card_id, "sequence": sequence})
