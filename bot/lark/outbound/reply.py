"""``LarkReply`` implements ``bot.core.reply.Reply`` for one inbound message: a reaction
while working, a CardKit streaming card for long or slow answers (throttled under
the per-card limit, sequences strictly increasing), and a plain text/post reply
otherwise or as the fallback when any card call fails.

The final answer's failure reaches the handler as ``bot.core.reply.DeliveryError`` (permanent or
not), never as a Lark error.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable

import structlog

from bot.lark.outbound.cards import (
    CARD_TEXT_MAX_BYTES,
    ELEMENT_ID,
    card_reference,
    close_streaming_settings,
    fit_card_text,
    streaming_card,
)
from bot.lark.openapi.client import Category, LarkApiError
from bot.lark.outbound.render import TEXT_CHUNK_CHARS, defuse_mentions, derive_uuid, render, split_text
from bot.lark.outbound.sender import LarkSender
from bot.core.reply import Capability, DeliveryError, ReplyBase

if TYPE_CHECKING:
    from bot.delivery.outbox_store import CardLedger

GIVE_UP = (Category.PERMISSION, Category.BAD_REQUEST)   # Lark will not take this answer later either
WORKING_AFTER_S = 1.0          # the "typing" reaction appears only when an answer takes longer
# A cancel (the shutdown deadline) that lands while the answer is being handed to Lark lets
# that hand-over end for up to this long: the request may already have reached Lark, and only
# its answer says so — without it the inbox stays pending and the restart asks the model again.
DELIVERY_GRACE_S = 1.0
SEQUENCE_EPOCH = 1767225600.0   # 2026-01-01T00:00:00Z: CardKit sequences count deciseconds from here




class LarkReply(ReplyBase):
    """``bot.core.reply.Reply`` for one inbound Lark message.

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

    # Buttons: a side-effecting tool call in a group and a destructive command are confirmed
    # by the asker's click on a card.
    # A recalled message's half-written answer is deleted from the chat.
    capabilities = frozenset({Capability.CONFIRM_TOOL, Capability.CONFIRM_COMMAND, Capability.WITHDRAW,
                              Capability.MEMORY_CARD})

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
        locale: str = "zh_cn",
        delivery_grace_s: float = DELIVERY_GRACE_S,
        log=None,
    ) -> None:
        self._sender = sender
        self._delivery_grace_s = delivery_grace_s
        self.tool_confirmations = None   # bot.tools.confirm.ToolConfirmations (set by the app)
        self.asker = ""                  # the open_id whose click may confirm a tool call
        self.record_sent = None      # Outbox.text_sent when replies may be recalled (ETHAN_RECALL_REPLIES)
        # chat_events.confirm_card_sent: a confirm card's buttons act only once it is recorded
        # (bot/lark/card_clicks.py, the ws helper's; issue 32 Low)
        self.record_confirm_card = None
        # chat_events.memory_card_sent: a /memory card's buttons act only once it is recorded,
        # with its owner and chat type (issue 45 N11)
        self.record_memory_card = None
        self._wall_clock = wall_clock
        self.locale = locale             # the user's: posts carry it (bot/lark/outbound/render.py)
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
    @property
    def delivered(self) -> bool:
        return self.delivered_as is not None

    async def working(self) -> None:
        if self._reaction_task is None and not self._finished:
            self._reaction_task = asyncio.create_task(self._add_reaction_later())

    async def stream(self, text_so_far: str) -> None:
        if self._finished or self.card_failed:
            return
        text_so_far = defuse_mentions(text_so_far)   # what the model wrote pings no one
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

    @property
    def finishing(self) -> bool:
        """The final text is being (or was) handed to Lark (bot/core/inflight.py: not cancelled then)."""
        return self._finished

    async def withdraw(self) -> int:
        """The user recalled the message while this answer was being written: stop streaming
        and delete what reached the chat (the half-streamed card, any text sent). Returns how
        many messages were deleted."""
        self._finished = True
        self._closing.set()
        self._wake.set()
        if self._worker is not None:
            # It stops at the next step; a card being opened is opened first, then deleted.
            await asyncio.gather(self._worker, return_exceptions=True)
        await self._clear_reaction()
        deleted = 0
        for mid in self.message_ids:
            try:
                await self._sender.api.request("DELETE", f"/open-apis/im/v1/messages/{mid}")
                deleted += 1
            except LarkApiError as e:   # already gone, or Lark refuses: the card stays, logged
                self._log.warning("lark.reply.not_withdrawn", reply_message_id=mid, **e.log_fields())
        return deleted

    async def confirm_tool(self, name: str, args: dict) -> bool:
        """Ask the asker to confirm a side-effecting tool call (a group): a card with run /
        cancel buttons; True only after the asker's click within CONFIRM_WAIT_S."""
        import asyncio
        import json as _json

        from bot.lark.outbound.cards import confirm_outcome_card, tool_confirm_card
        from bot.tools.confirm import CONFIRM_WAIT_S

        conf = self.tool_confirmations
        if conf is None or not self.asker:
            return False
        token, fut = conf.open(self.asker)
        shown = _json.dumps(args, ensure_ascii=False)[:600]
        question = defuse_mentions(f"要执行 **{name}** 吗？ / Run **{name}**?\n\n`{shown}`\n\n"
                                   "只有提问的人可以确认。 / Only the person who asked can confirm.")
        try:
            mid = await self._sender.reply(self.message_id, "interactive",
                                           tool_confirm_card(question, token=token, user_id=self.asker),
                                           uuid=derive_uuid(self.uuid_base, f"tool-{token}"),
                                           chat_id=self.chat_id, in_thread=self.in_thread)
        except LarkApiError as e:
            conf.close(token)
            self._log.info("lark.tool_confirm.failed", **e.log_fields())
            return False
        try:
            yes = await asyncio.wait_for(fut, CONFIRM_WAIT_S)
        except asyncio.TimeoutError:
            yes = False
        finally:
            conf.close(token)
        self._log.info("tool.confirm", tool=name, confirmed=yes)
        try:
            await self._sender.api.request("PATCH", f"/open-apis/im/v1/messages/{mid}", json={"content": _json.dumps(
                confirm_outcome_card(f"`{name}`", "confirmed" if yes else "cancelled"), ensure_ascii=False)})
        except Exception:  # noqa: BLE001 — the card's look is cosmetic; the decision stands
            pass
        return yes

    async def ask_confirm(self, text: str, *, command: str, user_id: str, chat_type: str) -> None:
        """A destructive command's question as a card with confirm/cancel buttons (the typed
        ``confirm`` the text mentions still works); a card Lark refuses falls back to text."""
        from bot.lark.outbound.cards import confirm_card

        async def sent(mid: str) -> None:
            if self.record_confirm_card is not None:
                await self.record_confirm_card(mid, user_id)

        await self._card_or_text(
            lambda: confirm_card(defuse_mentions(text), command=command, user_id=user_id, chat_type=chat_type),
            "confirm", text, sent)

    async def memory_card(self, view, *, chat_type: str) -> None:
        """/memory as a card with Forget / Correct buttons (bot/lark/outbound/memory_card.py); a card
        Lark refuses falls back to the text."""
        from bot.lark.outbound.memory_card import memory_card

        async def sent(mid: str) -> None:
            if self.record_memory_card is not None:
                await self.record_memory_card(mid, view.owner, chat_type)

        await self._card_or_text(lambda: memory_card(view, chat_type=chat_type), "memory", str(view), sent)

    async def _card_or_text(self, build, kind: str, text: str, sent) -> None:
        """The whole answer as one card (``kind`` names its uuid and log line); a card Lark
        refuses as a bad request falls back to ``text``, anything Lark will never take is final."""
        if self._finished:
            return
        self._finished = True
        self._closing.set()
        async def deliver() -> None:
            mid = await self._sender.reply(self.message_id, "interactive", build(),
                                           uuid=derive_uuid(self.uuid_base, kind),
                                           chat_id=self.chat_id, in_thread=self.in_thread)
            self.message_ids.append(mid)
            self.delivered_as = "card"
            if sent is not None:
                await sent(mid)

        try:
            try:
                await self._let_end(deliver())
                return
            except LarkApiError as e:
                if e.category in GIVE_UP and e.category is not Category.BAD_REQUEST:
                    raise DeliveryError(f"lark code {e.code}: {e.msg}", permanent=True,
                                        code=e.code, category=e.category.value) from e
                self._log.info(f"lark.{kind}_card.failed", **e.log_fields())
            self._finished = False
            await self.finish(text)
        finally:
            await self._clear_reaction()

    async def _finish(self, text: str) -> None:
        if self._finished:
            self._log.warning("lark.reply.finish_again")
            return
        self._finished = True
        text = defuse_mentions(text.strip())
        self._closing.set()
        self._wake.set()
        try:
            await self._let_end(self._deliver(text))
        finally:
            await self._clear_reaction()

    async def _deliver(self, text: str) -> None:
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

    async def _let_end(self, delivery) -> None:
        """Run ``delivery`` so that a cancel lets it end for up to ``DELIVERY_GRACE_S`` before
        the cancel goes on: ``delivered_as`` then says whether the answer reached Lark."""
        task = asyncio.ensure_future(delivery)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                await asyncio.wait({task}, timeout=self._delivery_grace_s)
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)   # its error, if any, is not ours now
            self._log.info("lark.reply.cancelled", delivered=self.delivered_as)
            raise

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
            msg_type, content = render(chunk, self.locale)
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
            msg_type, content = render(chunk, self.locale)
            uuid = derive_uuid(self.uuid_base, i)
            mid = await self._sender.reply(
                self.message_id, msg_type, content, uuid=uuid,
                chat_id=self.chat_id, in_thread=self.in_thread,
            )
            self.message_ids.append(mid)
            if self.record_sent is not None and mid:
                await self.record_sent(uuid, chat_id=self.chat_id, reply_to=self.message_id, lark_message_id=mid)
