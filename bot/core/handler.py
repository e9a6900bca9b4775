"""From a message to an answer: filter by the chat rules, then command or agent.

Two kinds of job reach it, both inside the conversation's mailbox (bot/delivery/dispatcher.py), so one
conversation's messages are handled in order:

* an ``InboxItem`` — a Lark event acknowledged after it was stored. The transport's
  ``decode`` turns it, once, into a neutral event: a message's ``Inbound``, answered here, or
  a chat's lifecycle event (a recall, a join, a card click), which ``events`` — the core's
  decisions, bot/core/lifecycle.py — handles by its table. The inbox row is marked
  done only after the reply was handed to the transport; a crash before that leaves it
  pending, to be answered on the next start (with the same uuids, so Lark never shows a
  reply twice).
* a ``DirectJob`` — an interface that waits for its answer (console playground, terminal
  chat, ``/chat``) hands over its ``Inbound``, its ``Reply`` and a future the handler
  resolves with the ``Outcome``. Nothing is written to the inbox: the caller is still
  there to hear the outcome (see bot/delivery/direct.py for what replaces the inbox's guarantees).

Nothing here knows a transport: messages are ``bot.core.inbound.Inbound``, replies
``bot.core.reply.Reply``, and an answer that could not be delivered is a ``DeliveryError``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from dataclasses import replace

from bot.agent.agent import Agent, AgentResult, UserTurn
from bot.agent.prompt import with_material
from bot.media.attachments import AttachmentError, Fetch, prepare, refusal
from bot.core.lifecycle import Lifecycle
from bot.commands.context import Confirmation
from bot.commands.memory import MemoryView
from bot.core.inbound import Inbound, NotAMessage
from bot.core.inflight import InFlight
from bot.media.stt import Transcriber
from bot.media.parse_pool import ParsePool
from bot.delivery.inbox_store import STALE_SECONDS, Inbox, InboxItem
from bot.infra.log import get_logger
from bot.core.quoting import QuoteFetch, quote_block
from bot.core.reply import Capability, DeliveryError, Reply
from bot.core.text import is_chinese

log = get_logger("ethan.handler")

UNREADABLE = {
    "image": ("图片", "images"), "file": ("文件", "files"), "audio": ("语音", "voice messages"),
    "media": ("视频", "videos"), "sticker": ("表情包", "stickers"),
    "share_chat": ("群名片", "shared chats"), "share_user": ("个人名片", "shared contacts"),
    "interactive": ("卡片消息", "cards"), "location": ("位置", "locations"),
    "merge_forward": ("合并转发的消息", "forwarded message bundles"),
}
EMPTY_REPLY = {"zh": "我在～有什么可以帮你的？", "en": "I'm here — what can I do for you?"}


def unreadable_reply(message_type: str, *, chinese: bool = True) -> str:
    zh, en = UNREADABLE.get(message_type, ("这种消息", "this kind of message"))
    if chinese:
        return f"抱歉，我暂时还看不懂{zh}，可以用文字告诉我吗？"
    return f"Sorry, I can't read {en} yet — could you tell me in text?"


class HeardReply:
    """The reply to a voice message: what was heard, quoted above the answer (streamed and
    final), so a wrong transcript is seen at once. Everything else is the wrapped reply's."""

    def __init__(self, inner: Reply, transcript: str) -> None:
        self._inner = inner
        heard = " ".join(transcript.split())
        self._prefix = f"🎤 「{heard[:500]}{'…' if len(heard) > 500 else ''}」\n\n"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def working(self) -> None:
        await self._inner.working()

    async def stream(self, text_so_far: str) -> None:
        await self._inner.stream(self._prefix + text_so_far)

    async def finish(self, text: str) -> None:
        await self._inner.finish(self._prefix + text)


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str            # answered | ignored | stopped (| timeout, from bot/delivery/direct.py)
    reason: str = ""       # why ignored


@dataclass(slots=True)
class DirectJob:
    """A message whose sender waits for the outcome (bot/delivery/direct.py)."""

    inbound: Inbound
    reply: Reply
    done: "asyncio.Future[Outcome]"


class CommandRunner(Protocol):
    async def run(self, inbound: Inbound, text: str) -> str | None:
        """The command's answer, or None when ``text`` is not a command."""


class NameResolver(Protocol):
    async def name(self, open_id: str) -> str: ...
    async def known_name(self, open_id: str) -> str: ...   # "" when only a fallback is known


@dataclass
class HandlerDeps:
    inbox: Inbox
    agent: Agent
    commands: CommandRunner
    # The transport's adapter for stored items: item -> Inbound (a message) or a bot/core/lifecycle.py
    # event; NotAMessage (ignored) or ValueError (unparseable) otherwise.
    decode: Callable[[InboxItem], Awaitable[Any]]
    make_reply: Callable[..., Reply]   # (inbound, *, resumed: an earlier run started it)
    bot_open_id: Callable[[], Awaitable[str]]   # waits until the bot's identity is known
    is_admin: Callable[[str], bool]
    respond_to_all: bool = False
    names: NameResolver | None = None
    on_ignored: Callable[[str], None] | None = None
    on_replied: Callable[[float], None] | None = None
    # An answer Lark did not take for a reason that may pass: hand the item back to be tried
    # again later in this process (returns the delay in s, or None when it will not be).
    retry_later: Callable[[InboxItem], float | None] | None = None
    # What happens with the events that are not new messages (a recall, a join, a card click:
    # bot/core/lifecycle.py decides and finishes the item), and which chats are no longer answered.
    events: "Lifecycle | None" = None
    # Fetches a message's attachments (bot/media/attachments.py); None: they are answered politely.
    fetch: "Fetch | None" = None
    # Where attachments are parsed (bot/media/parse_pool.py): worker processes, never this loop.
    parse_pool: "ParsePool | None" = None
    vision: Callable[[], bool] = lambda: True   # the answering model reads image blocks
    # Fetches the message a reply quotes (bot/core/quoting.py); None: the quote is not read.
    quote: "QuoteFetch | None" = None
    # When @-mentioned in a group: the discussion before the message, fenced ("" = none).
    discussion: Callable[[Inbound], Awaitable[str]] | None = None
    # What the sender last said in the conversation (memory.sessions.store.last_user_text): the
    # language a message without words (an image, a sticker, voice) is answered in.
    last_words: Callable[[str, str], Awaitable[str | None]] | None = None
    # Speech to text for voice messages (bot/media/stt.py); None: they are answered politely.
    stt: "Transcriber | None" = None
    # Answers being written, by message id: a recall stops its own (bot/core/inflight.py).
    inflight: "InFlight | None" = None


class MessageHandler:
    def __init__(self, deps: HandlerDeps, *, clock=time.time) -> None:
        self.d = deps
        self.clock = clock

    async def __call__(self, job: InboxItem | DirectJob) -> None:
        if isinstance(job, DirectJob):
            await self.handle_direct(job)
        else:
            await self.handle(job)

    async def handle_direct(self, job: DirectJob) -> None:
        inbound = job.inbound
        bound = log.bind(message_id=inbound.message_id, chat_id=inbound.chat_id, transport=inbound.transport)
        try:
            reason = self.skip_reason(inbound, await self.d.bot_open_id())
            if reason:
                bound.info("event.ignored", reason=reason)
                if self.d.on_ignored is not None:
                    self.d.on_ignored(reason)
                outcome = Outcome("ignored", reason)
            else:
                started = time.monotonic()
                result = await self._answer(inbound, job.reply, bound)
                if result is not None and result.answered_with:
                    # Its words were answered in a later message's turn (a retry after a fault):
                    # the caller waiting here hears that answer; it is no chat, nothing doubles.
                    await job.reply.finish(result.text)
                if self.d.on_replied is not None:
                    self.d.on_replied(time.monotonic() - started)
                outcome = Outcome("answered")
        except BaseException as e:
            if not job.done.done():
                if isinstance(e, Exception):
                    job.done.set_exception(e)
                else:   # cancelled at the shutdown deadline: the waiter hears it, not a hang
                    job.done.set_result(Outcome("stopped", "the bot stopped before answering"))
            raise
        if not job.done.done():
            job.done.set_result(outcome)

    async def handle(self, item: InboxItem) -> None:
        d = self.d
        bound = log.bind(event_id=item.event_id, message_id=item.message_id or "", chat_id=item.chat_id)
        if not await d.inbox.start(item.id):
            why = await d.inbox.why_unclaimed(item.id)
            if why == "recalled":
                # Its message was recalled while it waited in its mailbox: no reply is sent.
                bound.info("event.ignored", reason="recalled before it was answered")
                if d.on_ignored is not None:
                    d.on_ignored("recalled")
            else:
                # Another replica holds it or has finished it: that replica answers (or did).
                bound.info("event.not_claimed", inbox_id=item.id, why=why)
            return
        try:
            inbound = await d.decode(item)      # the one decode of this event
        except NotAMessage as e:
            await self._ignore(item, str(e), bound)
            return
        except (ValueError, RecursionError) as e:   # pydantic's ValidationError included
            bound.warning("event.unparseable", error=str(e)[:300])
            await d.inbox.finish(item.id, "failed", "unparseable event")
            return
        if not isinstance(inbound, Inbound):
            if d.events is None:
                await self._ignore(item, "unhandled event type", bound)
            else:
                await d.events.handle(item, inbound)
            return
        if d.events is not None and await d.events.chat_left(inbound.chat_id):
            await d.inbox.finish(item.id, "ignored", "bot removed from the chat")
            return
        bot_id = await d.bot_open_id()

        reason = self.skip_reason(inbound, bot_id)
        if reason:
            await self._ignore(item, reason, bound)
            return

        inbound = replace(inbound, language=await self.language(inbound))
        reply = d.make_reply(inbound, resumed=item.attempts > 0)
        started = time.monotonic()
        try:
            if await self._answer_unless_recalled(inbound, reply, bound):
                await d.inbox.finish(item.id, "ignored", "recalled")
                if d.on_ignored is not None:
                    d.on_ignored("recalled")
                return
            await d.inbox.finish(item.id, "done")
        except DeliveryError as e:
            # Delivery failed after the transport's retries; its own log line already says why,
            # with the ids. Refused for good: recorded as failed, not replayed at every start.
            # Otherwise it stays pending and is tried again later (the stored answer is
            # replayed under the same uuid) until the 30-minute rule drops it.
            retry_in = None
            if e.permanent:
                await d.inbox.finish(item.id, "failed", e.reason)
            elif d.retry_later is not None:
                retry_in = d.retry_later(item)
            bound.warning("reply.undelivered", **e.fields,
                          inbox="failed" if e.permanent else "pending", retry_in_s=retry_in)
            return
        except asyncio.CancelledError:
            # Cancelled at the shutdown deadline after the answer was delivered (e.g. while the
            # "typing" reaction was being removed): record it, or the restart would answer again.
            if reply.delivered:
                await d.inbox.finish(item.id, "done", "delivered; cancelled after")
            raise
        if d.on_replied is not None:
            d.on_replied(time.monotonic() - started)

    async def _answer_unless_recalled(self, inbound: Inbound, reply: Reply, bound: Any) -> bool:
        """Answer in a task a recall can stop (bot/core/inflight.py). True when it was recalled:
        what had reached the user is withdrawn; the recall, next in this mailbox, takes the
        message and what was stored of the answer out of memory."""
        reg = self.d.inflight
        if reg is None or not inbound.message_id:
            await self._answer(inbound, reply, bound)
            return False
        task = asyncio.get_running_loop().create_task(self._answer(inbound, reply, bound),
                                                      name=f"answer:{inbound.message_id}")
        answer = reg.start(inbound.message_id, inbound.chat_id, reply, task)
        try:
            try:
                await task      # a shutdown cancelling this job cancels the answer too
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not answer.stopped or (me is not None and me.cancelling()):
                    raise
        finally:
            reg.end(answer)
        if not answer.stopped:
            return False
        taken_back = await reply.withdraw() if Capability.WITHDRAW in reply.capabilities else 0
        bound.info("reply.stopped_by_recall", finished=task.done() and not task.cancelled(),
                   withdrawn=taken_back)
        return True

    async def _answer(self, inbound: Inbound, reply: Reply, bound: Any) -> "AgentResult | None":
        """Answer ``inbound``; the agent's result when the agent answered (None otherwise)."""
        d = self.d
        chinese = (inbound.language or await self.language(inbound)) == "zh"
        prepared = None
        typed = inbound.text      # before attachments add their references (a file's name is not typed)
        if inbound.attachments and d.fetch is not None and d.parse_pool is not None:
            try:
                prepared = await prepare(inbound, d.fetch, vision=d.vision(), pool=d.parse_pool, stt=d.stt)
            except AttachmentError as e:
                # One line with the ids (bound) and the transport's codes; nothing is stored.
                bound.warning("attachment.refused", reason=e.reason, detail=e.detail[:200],
                              kinds=[a.kind for a in inbound.attachments], **e.fields)
                ext = str(e.fields.get("ext", ""))
                await reply.finish(refusal(e.reason, str(e.fields.get("kind", "file")), chinese=chinese,
                                           ext=f".{ext}" if ext else "",
                                           limit_s=float(e.fields.get("limit_s", 0) or 0)))
                return
            if prepared.transcript:
                # A voice message is answered as if typed; the reply shows what was heard.
                inbound = replace(inbound, text=prepared.transcript)
                reply = HeardReply(reply, prepared.transcript)
                bound.info("voice.transcribed", seconds=round(prepared.audio_seconds, 1),
                           chars=len(prepared.transcript))
            inbound = replace(inbound, text="\n\n".join(x for x in (inbound.text, prepared.text) if x),
                              material=inbound.material + tuple(prepared.material))
            for e in prepared.skipped:
                bound.warning("attachment.skipped", reason=e.reason, detail=e.detail[:200], **e.fields)
            bound.info("attachment.read", kinds=[a.kind for a in inbound.attachments],
                       images=len(prepared.images), image_bytes=prepared.image_bytes, cut=prepared.cut)
        if inbound.text == "" and inbound.message_type not in ("text", "post"):
            await reply.finish(unreadable_reply(inbound.message_type, chinese=chinese))
        elif inbound.content_error:
            bound.warning("event.bad_content", error=inbound.content_error)
            await reply.finish(unreadable_reply(inbound.message_type, chinese=chinese))
        elif not inbound.text:
            await reply.finish(EMPTY_REPLY["zh" if chinese else "en"])
        else:
            answer = None if prepared is not None else await d.commands.run(inbound, inbound.text)
            if isinstance(answer, Confirmation) and Capability.CONFIRM_COMMAND in reply.capabilities:
                await reply.ask_confirm(answer, command=answer.command, user_id=inbound.sender_id,
                                        chat_type=inbound.chat_type)
                bound.info("command.confirm_asked", command=answer.command.split()[0][:32])
            elif isinstance(answer, MemoryView) and Capability.MEMORY_CARD in reply.capabilities:
                await reply.memory_card(answer, chat_type=inbound.chat_type)     # Forget / Correct buttons
                bound.info("command.answered", command="/memory", card=True)
            elif answer is not None:
                await reply.finish(answer)
                bound.info("command.answered", command=inbound.text.split()[0][:32])
            else:
                name = ""
                if inbound.chat_type != "p2p":   # a group's speakers are told apart by name
                    name = inbound.sender_name
                    if not name and d.names is not None:
                        name = await d.names.name(inbound.sender_id)
                # The user's words, then what is not theirs fenced as data (stored so, too).
                text = with_material(inbound.text, inbound.material)
                images = tuple(prepared.images) if prepared is not None else ()
                # Other people's words fetched for this answer (the group's discussion, the
                # quoted message): fenced the same way, sent with this request only, never stored.
                material: list[str] = []
                if inbound.chat_type == "p2p" and d.names is not None:
                    # Who this is, in a direct chat too (contact API, cached a day); an id-tail
                    # fallback (no contact scope) says nothing and is left out.
                    who = await d.names.known_name(inbound.sender_id)
                    if who:
                        who = " ".join(who.replace("[", "(").replace("]", ")").split())[:64]
                        material.append(f"[私聊对象 / you are talking with: {who}]")
                if inbound.chat_type != "p2p" and d.discussion is not None:
                    block = await d.discussion(inbound)
                    if block:
                        material.append(block)
                if inbound.parent_id and d.quote is not None:
                    # The quoted message is data for this request only (its image too); an
                    # unreadable one becomes a short note.
                    q = await d.quote(inbound)
                    material.append(quote_block(q))
                    images = images + q.images
                    bound.info("quote.read", parent_id=inbound.parent_id,
                               chars=len(q.text), images=len(q.images), error=q.error)
                turn = UserTurn(scope=inbound.scope(is_admin=inbound.admin(d.is_admin)),
                            text=text, sender_name=name,
                            message_id=inbound.message_id, truncated=inbound.truncated,
                            images=images, material="\n\n".join(material),
                            heard=prepared.transcript if prepared is not None else "",
                            typed=typed if prepared is not None else None,
                            in_org=inbound.sender_in_org)
                return await d.agent.respond(turn, reply)
        return None

    async def language(self, inbound: Inbound) -> str:
        """The user's language: their words' when there are any, else what they last said in
        this conversation, else Chinese (a Feishu team's default)."""
        if inbound.language:
            return inbound.language
        if any(c.isalpha() for c in inbound.text):
            return "zh" if is_chinese(inbound.text) else "en"
        last = await self.d.last_words(inbound.conv_key, inbound.sender_id) if self.d.last_words else None
        if last and any(c.isalpha() for c in last):
            return "zh" if is_chinese(last) else "en"
        return "zh"

    def skip_reason(self, inbound: Inbound, bot_id: str) -> str:
        """The chat rules for what the bot answers (DESIGN.md §5, Lark's, kept by every
        interface so the console shows what Lark would do); '' means answer."""
        if inbound.from_bot or (inbound.sender_id and inbound.sender_id == bot_id):
            return "sent by a bot"
        if not inbound.sender_id:
            return "no sender"
        if inbound.create_time and self.clock() - inbound.create_time > STALE_SECONDS:
            return "older than 30 minutes"
        if inbound.chat_type != "p2p":
            addressed = inbound.mentions_bot or (self.d.respond_to_all and inbound.mentions_all)
            if not addressed:
                return "group message not addressed to the bot"
        return ""

    async def _ignore(self, item: InboxItem, reason: str, bound: Any) -> None:
        bound.info("event.ignored", reason=reason)
        await self.d.inbox.finish(item.id, "ignored", reason)
        if self.d.on_ignored is not None:
            self.d.on_ignored(reason)
