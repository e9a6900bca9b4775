"""``POST /chat``: the spec's Web API, another interface beside Lark, the console and the terminal.

    POST /chat  {"user_id": "ou_…", "text": "…", "conversation": "…"?, "as_admin": false?}
    → 200 {"reply": "…", "session_id": "…", "path": "fast|medium|full" | null, "memory": {…} | null}

``memory`` is the console's memory panel for this answer (what was put in the prompt); it and
``path`` are null when the model was not asked (a slash command, or a stored answer replayed).
Each ``user_id`` has its own conversations with Ethan: without ``conversation`` one default
conversation, otherwise one per name (it is the chat's thread, so ``/new``, ``/sessions`` and
modes are per conversation). Memory is the user's, as in a Lark p2p chat.

``Accept: text/event-stream``: the answer streams as Server-Sent Events — ``delta`` events
carrying only the new text (``{"text": piece}``; ``{"text": all, "replace": true}`` when the
text restarted), then one ``done`` event with the JSON body above, its ``reply`` the whole
answer (or one ``error`` event). A caller hanging up mid-stream is one info line.

``Idempotency-Key: <1–128 printable chars>``: a retried POST is answered once. A retry while
the first is running waits for the same answer; a retry afterwards (within 24 h, in this
process) gets the same body; after a restart the message's id — derived from user and key —
is already in its session, so the stored answer is replayed (the model is not asked again),
or, when the first attempt died before answering, the message is answered now without being
stored twice. The same key with another body is refused (422). See bot/delivery/direct.py.

The token holder is an operator speaking for ``user_id``: admin commands only when that user is
in ETHAN_ADMINS and ``as_admin`` is true (403 when it is not an admin); commands are audited
with channel ``/chat`` (bot/commands/dispatcher.py).

Access is the console's (``ETHAN_CONSOLE_TOKEN``, bot/web/auth.py); errors are JSON
``{"error": …}``: 400 bad JSON or fields (with the reason), 401/403 access, 422 key reused,
503 not accepting messages or the database unreachable (bot/web/errors.py), or
``{"error": "model_unusable", "kind": …, "reason": "<the line naming the setting>", "setting": …}``
when the model cannot work (a refused key, an unknown model, an unreachable endpoint, a spent
budget; the message stays in its session), 504 no answer within the reply deadline.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import re
import time
import uuid
from typing import Any

from aiohttp import web

from memory.governance.audit import AuditLog
from memory.sessions.chat_events import conversation_of_message

from bot.delivery.direct import NotAccepting
from bot.core.inbound import WEB_API, typed_message
from memory.scope import conversation_key
from bot.llm.health import problem_setting
from bot.infra.log import get_logger
from bot.core.reply import Capability, ReplyBase
from bot.web.auth import secure_headers
from bot.web.data import MAX_TEXT, ApiError, ConsoleData, ConsoleDeps, check_user, read_json

log = get_logger("ethan.chat")

CONVERSATION = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,128}$")
KEEP_ANSWERS_S = 24 * 3600
KEEP_ANSWERS = 10_000
CHAT_PREFIX = "api_"
# Failures retrying cannot fix (a refused key, an unknown model, an unreachable endpoint, a
# spent budget): 503 model_unusable. Passing ones (overloaded, a timeout) keep the apology.
UNUSABLE = ("auth", "not_found", "connection", "spend_limit")


class ChatReply(ReplyBase):
    """A Reply for one /chat request; streams into a queue when the caller asked for SSE."""

    # The body's ``memory`` is the memory panel; a model failure is a 503, not 200 + apology.
    capabilities = frozenset({Capability.MEMORY_PANEL, Capability.FAILURE_STATUS})

    def __init__(self, stream: bool) -> None:
        self.text: str | None = None
        self.memory: dict | None = None
        # (piece, replace): only the new text of each update; replace when the text restarted
        self.deltas: asyncio.Queue[tuple[str, bool]] | None = asyncio.Queue() if stream else None
        self._sent = ""
        self.failure = ""          # the model failure's kind when the answer is an apology

    def note_failure(self, kind: str) -> None:
        self.failure = kind

    async def working(self) -> None:
        return None

    async def stream(self, text_so_far: str) -> None:
        if self.deltas is None:
            return
        if text_so_far.startswith(self._sent):
            piece, restart = text_so_far[len(self._sent):], False
        else:                       # the text restarted (another model after a failure)
            piece, restart = text_so_far, True
        self._sent = text_so_far
        if piece or restart:
            self.deltas.put_nowait((piece, restart))

    async def finish(self, text: str) -> None:
        self.text = text

    def show_memory(self, blocks: Any) -> None:
        try:
            self.memory = blocks.as_dict()
        except Exception as e:  # noqa: BLE001 — the panel must never break a reply
            self.memory = {"error": f"{type(e).__name__}: {e}"[:200]}


def chat_id(user_id: str) -> str:
    return CHAT_PREFIX + user_id


class WebChat:
    def __init__(self, deps: ConsoleDeps, data: ConsoleData, *, clock=time.monotonic) -> None:
        self.d = deps
        self.data = data
        self.clock = clock
        # (user, key) -> (request fingerprint, the answer's future); finished ones kept a day.
        self._answers: collections.OrderedDict[tuple[str, str], tuple[str, float, asyncio.Future]] = \
            collections.OrderedDict()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        stream = "text/event-stream" in request.headers.get("Accept", "")
        try:
            body = await read_json(request)
            user_id, text, conversation = self._fields(body)
            as_admin = body.get("as_admin", False)
            if not isinstance(as_admin, bool):
                raise ApiError(400, "as_admin must be true or false")
            if as_admin and not self.d.is_admin(user_id):
                log.warning("chat.admin_refused", user_id=user_id, channel="/chat")
                await AuditLog(self.data.m.db).record(user_id, "as_admin", "", chat_id(user_id),
                                                      "refused: not in ETHAN_ADMINS", allowed=False,
                                                      channel="/chat")
                raise ApiError(403, "as_admin: this user_id is not in ETHAN_ADMINS")
            key = request.headers.get("Idempotency-Key")
            if key is not None and not IDEMPOTENCY_KEY.match(key):
                raise ApiError(400, "Idempotency-Key must be 1-128 printable ASCII characters")
        except ApiError as e:
            return web.json_response({"error": e.message, **e.extra}, status=e.status)
        reply = ChatReply(stream)
        answer = self._answer(user_id, text, conversation, key, reply, as_admin)
        if not stream:
            status, out = await answer
            return web.json_response(out, status=status, dumps=_dumps)
        return await self._stream(request, reply, answer)

    def _fields(self, body: dict) -> tuple[str, str, str]:
        user_id, text, conversation = body.get("user_id"), body.get("text"), body.get("conversation", "")
        unknown = set(body) - {"user_id", "text", "conversation", "as_admin"}
        if unknown:
            raise ApiError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        check_user(user_id)
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "text must be a non-empty string")
        if len(text) > MAX_TEXT:
            raise ApiError(413, f"text is longer than {MAX_TEXT} characters")
        if conversation is None:
            conversation = ""
        if not isinstance(conversation, str) or (conversation and not CONVERSATION.match(conversation)):
            raise ApiError(400, "conversation must be 1-64 letters, digits, or _ . : -")
        return user_id, text, conversation

    async def _answer(self, user_id: str, text: str, conversation: str, key: str | None,
                      reply: ChatReply, as_admin: bool = False) -> tuple[int, dict]:
        if key is None:
            return await self._run(uuid.uuid4().hex, user_id, text, conversation, reply, as_admin)
        self._expire()
        fingerprint = hashlib.sha256(json.dumps([text, conversation, as_admin]).encode()).hexdigest()
        # The message id follows from user and key: after a restart the session knows it, and
        # its conversation — the same key in another one is another request (422), not that
        # conversation's answer replayed. Read before the in-process record: no await between
        # reading that record and registering a task in it (two concurrent retries would run).
        mid = hashlib.sha256(f"{user_id}\0{key}".encode()).hexdigest()[:32]
        known_conv = await conversation_of_message(self.data.m.db, "chat_" + mid)
        if known_conv is not None and known_conv != conversation_key(chat_id(user_id), conversation):
            return 422, {"error": "this Idempotency-Key was used for another request"}
        slot = (user_id, key)
        known = self._answers.get(slot)
        if known is not None:
            if known[0] != fingerprint:
                return 422, {"error": "this Idempotency-Key was used for another request"}
            log.info("chat.retried", user_id=user_id)
            return await asyncio.shield(known[2])
        # Its own task: a caller that hangs up does not cancel the answer a retry will want.
        task = asyncio.ensure_future(self._run(mid, user_id, text, conversation, reply, as_admin))
        self._answers[slot] = (fingerprint, self.clock(), task)

        def forget_unanswered(t: asyncio.Future) -> None:
            # Not answered (not accepting, overdue, failed): a retry tries again.
            if t.cancelled() or t.exception() is not None or t.result()[0] >= 500:
                if self._answers.get(slot, (None, None, None))[2] is t:
                    self._answers.pop(slot, None)

        task.add_done_callback(forget_unanswered)
        return await asyncio.shield(task)

    async def _run(self, mid: str, user_id: str, text: str, conversation: str,
                   reply: ChatReply, as_admin: bool = False) -> tuple[int, dict]:
        inbound = typed_message(transport=WEB_API, message_id="chat_" + mid, chat_id=chat_id(user_id),
                                thread_id=conversation, sender_id=user_id, text=text)
        if as_admin:
            inbound = dataclasses.replace(inbound, as_admin=True)
        try:
            outcome = await self.d.conversations.ask(inbound, reply)
        except NotAccepting:
            return 503, {"error": "the bot is not accepting messages right now"}
        if outcome.status == "ignored":
            return 422, {"error": "not answered", "reason": outcome.reason}
        if outcome.status != "answered":
            return 504, {"error": "no answer", "reason": outcome.reason}
        problem = self.d.model_problem() if reply.failure else ""
        # a timeout where the start-up check found the endpoint unreachable is that, not a pause
        if reply.failure in UNUSABLE or (reply.failure == "timeout" and "cannot reach" in (problem or "")):
            # A model that cannot work is the operator's to fix: a 503 naming the setting, not
            # a 200 whose body is an apology a client would show as the answer.
            problem = problem or f"the model failed ({reply.failure})"
            log.warning("chat.model_unusable", user_id=user_id, kind=reply.failure)
            return 503, {"error": "model_unusable", "kind": reply.failure, "reason": problem,
                         "setting": problem_setting(problem)}
        active = await self.data.m.sessions.active(inbound.conv_key)
        memory = reply.memory
        return 200, {"reply": reply.text, "session_id": active.id if active else None,
                     "path": memory.get("path") if memory else None, "memory": memory}

    def _expire(self) -> None:
        cutoff = self.clock() - KEEP_ANSWERS_S
        while self._answers:
            slot, (_, at, future) = next(iter(self._answers.items()))
            if (at >= cutoff and len(self._answers) <= KEEP_ANSWERS) or not future.done():
                break
            self._answers.popitem(last=False)

    async def _stream(self, request: web.Request, reply: ChatReply, answer) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        secure_headers(resp)        # now: the guard's own call comes after the headers are sent
        await resp.prepare(request)
        task = asyncio.ensure_future(answer)
        assert reply.deltas is not None
        try:
            while not task.done():
                getter = asyncio.ensure_future(reply.deltas.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    piece, restart = getter.result()
                    await resp.write(_event("delta", {"text": piece, "replace": True} if restart else {"text": piece}))
                else:
                    getter.cancel()
            while not reply.deltas.empty():
                piece, restart = reply.deltas.get_nowait()
                await resp.write(_event("delta", {"text": piece, "replace": True} if restart else {"text": piece}))
            status, out = task.result()
            if status == 200 and isinstance(out.get("reply"), str):
                # the deltas add up to the answer: what the last stream update had not carried
                await reply.stream(out["reply"])
                while not reply.deltas.empty():
                    piece, restart = reply.deltas.get_nowait()
                    await resp.write(_event("delta", {"text": piece, "replace": True} if restart else {"text": piece}))
            await resp.write(_event("done" if status == 200 else "error", {**out, "status": status}
                                    if status != 200 else out))
            await resp.write_eof()
        except ConnectionError as e:
            # The caller hung up mid-stream: its answer still finishes (and is stored); one line.
            log.info("chat.client_gone", error=type(e).__name__)
        return resp


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()
