"""Outbound Lark messages: replies, reactions, streaming cards — retried, never doubled.

``LarkSender`` makes the Open API calls the bot needs. Every message send waits on
a per-chat token bucket (5 per second, DESIGN §5) and is retried by the
classification table in ``bot.lark.openapi``:

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

``LarkReply`` implements ``bot.reply.Reply`` for one inbound message: a reaction
while working, a CardKit streaming card for long or slow answers (throttled under
the per-card limit, sequences strictly increasing), and a plain text/post reply
otherwise or as the fallback when any card call fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable
from urllib.parse import quote

import structlog

from bot.lark.cards import (
    CARD_TEXT_MAX_BYTES,
    ELEMENT_ID,
    card_entity_body,
    card_reference,
    close_streaming_settings,
    fit_card_text,
    streaming_card,
)
from bot.lark.openapi import Category, LarkApiError, OpenApi
from bot.reply import DeliveryError
from bot.lark.ratelimit import KeyedRateLimiter

if TYPE_CHECKING:
    from bot.outbox import CardLedger

# ---------------------------------------------------------------------------------------
# uuids, text splitting, rendering
# ---------------------------------------------------------------------------------------

UUID_MAX = 50  # Lark's limit on the idempotency uuid of a message


GIVE_UP = (Category.PERMISSION, Category.BAD_REQUEST)   # Lark will not take this answer later either


def derive_uuid(base: str, *parts: object) -> str:
    """A deterministic uuid ``<base>-<part>-…`` (hashed when over Lark's 50 chars)."""
    joined = "-".join([base, *(str(p) for p in parts)])
    if len(joined) <= UUID_MAX:
        return joined
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:UUID_MAX]


TEXT_CHUNK_CHARS = 4000
WORKING_AFTER_S = 1.0          # the "typing" reaction appears only when an answer takes longer
SEQUENCE_EPOCH = 1767225600.0   # 2026-01-01T00:00:00Z: CardKit sequences count deciseconds from here

_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"[。！？!?.;；](?=\s|$)|[。！？；]")


def _fence_after(piece: str, fence: str | None) -> str | None:
    """The code fence still open after ``piece`` (its opening line), or None."""
    for line in piece.split("\n"):
        if _FENCE.match(line):
            fence = None if fence is not None else line.strip()
    return fence


def _best_cut(window: str) -> int:
    """Where to cut ``window``: a paragraph, a line, a sentence, a space — or hard."""
    floor = len(window) // 2
    for sep in ("\n\n", "\n"):
        i = window.rfind(sep)
        if i >= floor:
            return i + len(sep)
    ends = [m.end() for m in _SENTENCE_END.finditer(window) if m.end() >= floor]
    if ends:
        return ends[-1]
    i = max(window.rfind(" "), window.rfind("\t"))
    if i >= floor:
        return i + 1
    return len(window)


def split_text(text: str, limit: int = TEXT_CHUNK_CHARS, *, max_bytes: int | None = None) -> list[str]:
    """Split ``text`` into readable chunks of at most ``limit`` chars (and ``max_bytes``).

    Cuts prefer paragraph, then line, then sentence, then word boundaries. A code
    fence open at a cut is closed at the end of the chunk and reopened at the start
    of the next, so each chunk renders on its own.
    """
    if limit < 64:
        raise ValueError("limit too small")

    def fits(s: str) -> bool:
        return len(s) <= limit and (max_bytes is None or len(s.encode("utf-8")) <= max_bytes)

    if fits(text):
        return [text]
    chunks: list[str] = []
    rest = text
    fence: str | None = None
    while rest:
        prefix = f"{fence}\n" if fence else ""
        if fits(prefix + rest):
            chunks.append(prefix + rest)
            break
        budget = limit - len(prefix) - 4  # room to close a fence with "\n```"
        window = rest[:budget]
        if max_bytes is not None:
            window = fit_card_text(window, max_bytes - len(prefix.encode("utf-8")) - 8)
        cut = _best_cut(window) or len(window) or 1
        piece = rest[:cut]
        rest = rest[cut:].lstrip("\n")
        new_fence = _fence_after(piece, fence)
        body = prefix + piece
        if new_fence:
            body = body.rstrip("\n") + "\n```"
        body = body.rstrip() if not new_fence else body
        if body.strip():
            chunks.append(body)
        fence = new_fence
    return chunks


_MARKDOWN = re.compile(
    r"(^\s*(```|~~~))"                 # code fence
    r"|(^#{1,6}\s+\S)"                 # heading
    r"|(^\s*([-*+]|\d+[.)])\s+\S)"     # list item
    r"|(^\s*>\s)"                      # quote
    r"|(\*\*[^*\n]+\*\*)"              # bold
    r"|(\[[^\]\n]+\]\([^)\s]+\))"      # link
    r"|(^\|.+\|\s*$)"                  # table row
    r"|(`[^`\n]+`)",                   # inline code
    re.M,
)


def looks_like_markdown(text: str) -> bool:
    return bool(_MARKDOWN.search(text))


def render(text: str) -> tuple[str, dict[str, Any]]:
    """(msg_type, content) for one chunk: Markdown goes as a ``post`` with an ``md``
    paragraph (headings, lists, code render); plain prose as ``text``."""
    if looks_like_markdown(text):
        return "post", {"zh_cn": {"content": [[{"tag": "md", "text": text}]]}}
    return "text", {"text": text}


# ---------------------------------------------------------------------------------------
# Sender
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Reply
# ---------------------------------------------------------------------------------------


class LarkReply:
    """``bot.reply.Reply`` for one inbound Lark message.

    ``uuid_base`` comes from the inbound message id (deterministic), so a message
    processed again after a crash resends with the same uuids and Lark drops the
    duplicates: text chunks use ``<base>-<i>``, card overflow ``<base>-card-<i>``, the
    card message ``<base>-card`` (``<base>-card-<card_id>`` without a ledger). The card
    entity behind it is recorded in ``cards`` (the outbox) before the message is sent, so a
    run after a crash finishes the card already on screen rather than sending a second one;
    CardKit sequences are derived from the wall clock so they keep increasing across
    processes. The text fallback's uuids are independent of the card's, so a card that
    failed never blocks the text answer. Uuids over Lark's 50 characters are hashed.
    """

    def __init__(
        self,
        sender: LarkSender,
        *,
        message_id: str,
        chat_id: str,
        uuid_base: str,
        in_thread: bool = False,
        stream_after_s: float = 2.0,
        stream_min_chars: int = 600,
        card_update_interval: float = 0.5,
        text_limit: int = TEXT_CHUNK_CHARS,
        card_text_max_bytes: int = CARD_TEXT_MAX_BYTES,
        working_emoji: str = "Typing",
        working_after_s: float = WORKING_AFTER_S,
        element_id: str = ELEMENT_ID,
        idle_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        cards: "CardLedger | None" = None,
        resumed: bool = False,
        log=None,
    ) -> None:
        self._sender = sender
        self._wall_clock = wall_clock
        self._cards = cards
        # An earlier run of this message started answering it (the inbox says so): it may
        # have left a card on screen, even if this run's answer is short.
        self._resumed = resumed
        self.message_id = message_id
        self.chat_id = chat_id
        self.uuid_base = uuid_base
        self.in_thread = in_thread
        self._stream_after_s = stream_after_s
        self._stream_min_chars = stream_min_chars
        # CardKit allows 10 operations/s per card; never push faster than 10/s.
        self._interval = max(0.1, card_update_interval)
        self._text_limit = text_limit
        self._card_max_bytes = card_text_max_bytes
        self._emoji = working_emoji
        self._working_after_s = working_after_s
        self._reaction_sending = False
        self._element_id = element_id
        self._idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._log = (log or structlog.get_logger("ethan.lark")).bind(
            chat_id=chat_id, message_id=message_id
        )

        self._latest = ""
        self._first_stream_at: float | None = None
        self._worker: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._finished = False
        self._reaction_task: asyncio.Task | None = None

        self.card_id: str | None = None
        self.card_message_id: str | None = None
        self.card_failed = False
        self._sequence = 0
        self._pushed: str | None = None
        self._last_push = 0.0
        self.message_ids: list[str] = []  # every message this reply sent, in order
        self.delivered_as: str | None = None  # "text", "card", or "text-fallback"

    # ---- Reply protocol ------------------------------------------------------------------
    async def working(self) -> None:
        if self._reaction_task is None and not self._finished:
            self._reaction_task = asyncio.create_task(self._add_reaction_later())

    async def stream(self, text_so_far: str) -> None:
        if self._finished or self.card_failed:
            return
        self._latest = text_so_far
        now = self._clock()
        if self._first_stream_at is None:
            self._first_stream_at = now
        if self._worker is None:
            if not text_so_far.strip():
                return
            long_enough = len(text_so_far) >= self._stream_min_chars
            slow = now - self._first_stream_at >= self._stream_after_s
            if long_enough or slow:
                self._worker = asyncio.create_task(self._run_card())
        else:
            self._wake.set()

    async def finish(self, text: str) -> None:
        try:
            await self._finish(text)
        except LarkApiError as e:
            # The handler knows no Lark codes: say whether the answer can ever be delivered.
            raise DeliveryError(f"lark code {e.code}: {e.msg}", permanent=e.category in GIVE_UP,
                                code=e.code, category=e.category.value) from e

    async def _finish(self, text: str) -> None:
        if self._finished:
            self._log.warning("lark.reply.finish_again")
            return
        self._finished = True
        text = text.strip()
        self._closing.set()
        self._wake.set()
        try:
            if self._worker is not None:
                await self._worker
            elif self._resumed and self._cards is not None and text:
                await self._adopt_for_finish(text)
            if self.card_message_id and not self.card_failed:
                if await self._finish_card(text):
                    self.delivered_as = "card"
                    return
            await self._send_text(text)
            self.delivered_as = "text-fallback" if self._worker is not None else "text"
        finally:
            await self._clear_reaction()

    # ---- working reaction ----------------------------------------------------------------
    async def _add_reaction_later(self) -> str | None:
        # An answer ready within ``working_after_s`` needs no "typing" sign: it would be two
        # Open API calls (add, remove) against the app's rate limits for a flicker nobody sees.
        if self._working_after_s > 0:
            await asyncio.sleep(self._working_after_s)
        self._reaction_sending = True
        return await self._add_reaction()

    async def _add_reaction(self) -> str | None:
        try:
            return await self._sender.add_reaction(self.message_id, self._emoji)
        except LarkApiError as e:
            self._log.info("lark.reaction.failed", op="add", **e.log_fields())
        except Exception as e:  # best effort: never let a reaction break an answer
            self._log.info("lark.reaction.failed", op="add", error=repr(e))
        return None

    async def _clear_reaction(self) -> None:
        if self._reaction_task is None:
            return
        if not self._reaction_sending:       # still waiting to add it: nothing on screen
            self._reaction_task.cancel()
            return
        reaction_id = await self._reaction_task
        if not reaction_id:
            return
        try:
            await self._sender.remove_reaction(self.message_id, reaction_id)
        except LarkApiError as e:
            self._log.info("lark.reaction.failed", op="remove", **e.log_fields())
        except Exception as e:
            self._log.info("lark.reaction.failed", op="remove", error=repr(e))

    # ---- streaming card ------------------------------------------------------------------
    def _card_view(self, text: str) -> str:
        return fit_card_text(text, self._card_max_bytes)

    def _next_sequence(self) -> int:
        """CardKit refuses a sequence that does not increase, also across processes: a card
        adopted after a restart must continue above what the crashed run used. Deciseconds
        since 2026-01-01 (pushes are at most 10/s) fit int32 until 2032."""
        now = int((self._wall_clock() - SEQUENCE_EPOCH) * 10)
        self._sequence = max(self._sequence + 1, now)
        return self._sequence

    async def _open_card(self, first: str) -> None:
        """Create the card entity (or adopt the one an earlier run left) and reply with it."""
        uuid = derive_uuid(self.uuid_base, "card")
        card_id = await self._cards.card_for(uuid) if self._cards is not None else None
        if card_id:
            self.card_id = card_id
            self._log.info("lark.card.adopted", card_id=card_id)
            # The earlier run may have closed it (complete answer) or left it streaming.
            seq = self._next_sequence()
            await self._sender.open_streaming(card_id, seq, uuid=derive_uuid(self.uuid_base, "open", seq))
            await self._push(first)
        else:
            card_id = await self._sender.create_card(streaming_card(first, element_id=self._element_id))
            self.card_id = card_id
            if self._cards is not None:
                await self._cards.card_created(uuid, chat_id=self.chat_id, reply_to=self.message_id,
                                               card_id=card_id)
            else:
                # Nowhere to record the entity: name the message after it, or a run after a
                # crash would stream into a new entity while Lark shows the old message.
                uuid = derive_uuid(self.uuid_base, "card", card_id)
            self._pushed = first
        # With the ledger, the same uuid on every run: after a crash Lark answers with the
        # message already sent, which shows the entity recorded above.
        mid = await self._sender.reply(
            self.message_id, "interactive", card_reference(card_id), uuid=uuid,
            chat_id=self.chat_id, in_thread=self.in_thread,
        )
        self.card_message_id = mid
        self.message_ids.append(mid)
        self._last_push = self._clock()
        if self._cards is not None:
            await self._cards.sent(uuid, mid)

    async def _adopt_for_finish(self, text: str) -> None:
        """A short (or replayed) answer to a message an earlier run was streaming into a
        card: finish in that card instead of adding a text message under it."""
        try:
            if await self._cards.card_for(derive_uuid(self.uuid_base, "card")):
                await self._open_card(self._card_view(text))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.card_failed = True
            fields = e.log_fields() if isinstance(e, LarkApiError) else {"error": repr(e)}
            self._log.warning("lark.card.failed", stage="adopt", card_id=self.card_id, **fields)

    async def _run_card(self) -> None:
        """Create the card, reply with it, then push the latest text, coalesced and
        spaced ``card_update_interval`` apart, until ``finish`` takes over."""
        stage = "open"
        try:
            await self._open_card(self._card_view(self._latest))
            stage = "stream"
            while not self._closing.is_set():
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._idle_timeout_s)
                except asyncio.TimeoutError:
                    # No text and no finish() for this long: the agent is gone. CardKit closes
                    # streaming by itself after ~10 minutes; stop holding a task for it.
                    self._log.warning("lark.card.abandoned", card_id=self.card_id)
                    return
                self._wake.clear()
                wait = self._last_push + self._interval - self._clock()
                if wait > 0:
                    try:
                        await asyncio.wait_for(self._closing.wait(), timeout=wait)
                    except asyncio.TimeoutError:
                        pass
                if self._closing.is_set():
                    break
                view = self._card_view(self._latest)
                if view != self._pushed:
                    await self._push(view)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.card_failed = True
            fields = e.log_fields() if isinstance(e, LarkApiError) else {"error": repr(e)}
            self._log.warning("lark.card.failed", stage=stage, card_id=self.card_id, **fields)

    async def _push(self, text: str) -> None:
        assert self.card_id
        text = text or "…"  # CardKit refuses empty content
        seq = self._next_sequence()
        await self._sender.stream_card_text(
            self.card_id, self._element_id, text, seq, uuid=derive_uuid(self.uuid_base, "s", seq)
        )
        self._pushed = text
        self._last_push = self._clock()

    async def _finish_card(self, text: str) -> bool:
        """Final text into the card and streaming off; overflow follows as messages.
        False when the final text could not be shown (the caller falls back to text)."""
        assert self.card_id
        parts = split_text(text, limit=10 * self._text_limit, max_bytes=self._card_max_bytes) if text else ["…"]
        head, tail = parts[0], parts[1:]
        try:
            if head != self._pushed:
                await self._push(head)
        except Exception as e:
            self.card_failed = True
            fields = e.log_fields() if isinstance(e, LarkApiError) else {"error": repr(e)}
            self._log.warning("lark.card.failed", stage="final", card_id=self.card_id, **fields)
            return False
        seq = self._next_sequence()
        try:
            await self._sender.close_streaming(
                self.card_id, seq, settings=close_streaming_settings(text),
                uuid=derive_uuid(self.uuid_base, "close", seq),
            )
        except Exception as e:
            # The full answer is already on screen; the card closes itself after ~10 min.
            fields = e.log_fields() if isinstance(e, LarkApiError) else {"error": repr(e)}
            self._log.warning("lark.card.close_failed", card_id=self.card_id, **fields)
        for i, chunk in enumerate(tail):
            msg_type, content = render(chunk)
            mid = await self._sender.reply(
                self.message_id, msg_type, content, uuid=derive_uuid(self.uuid_base, "card", i),
                chat_id=self.chat_id, in_thread=self.in_thread,
            )
            self.message_ids.append(mid)
        return True

    # ---- plain text ----------------------------------------------------------------------
    async def _send_text(self, text: str) -> None:
        if not text.strip():
            self._log.warning("lark.reply.empty")
            return
        for i, chunk in enumerate(split_text(text, self._text_limit)):
            msg_type, content = render(chunk)
            mid = await self._sender.reply(
                self.message_id, msg_type, content, uuid=derive_uuid(self.uuid_base, i),
                chat_id=self.chat_id, in_thread=self.in_thread,
            )
            self.message_ids.append(mid)


__all__ = [
    "Category",
    "LarkReply",
    "LarkSender",
    "RetryPolicy",
    "derive_uuid",
    "looks_like_markdown",
    "render",
    "split_text",
]
