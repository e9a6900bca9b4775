"""Messages whose sender waits for the answer: the console playground, the terminal chat and
the ``/chat`` Web API.

``Conversations.ask(inbound, reply)`` puts the message into its conversation's mailbox in the
same dispatcher Lark's events go through (so one conversation stays in order, whichever
interface a message came from) and awaits a future the handler resolves with the outcome.
The reply object is the caller's own; nothing is polled and nothing is shared by id.

What Lark's inbox gives Lark, and what these interfaces have instead:

* *Acknowledged means stored.* Lark gets its HTTP 200 before the answer exists, so the event
  must be on disk first. Here the caller holds its request (or its terminal) open until the
  answer: nothing is acknowledged early. The user's message is committed to its session
  before the model is called (``SessionStore.append_user``), as for Lark.
* *Dedup.* Lark redelivers; the console and the terminal do not. ``/chat`` callers may retry:
  an ``Idempotency-Key`` makes the message id deterministic (``bot/web/chat.py``), so a retry
  while the first is still running waits for the same answer, a retry afterwards gets the
  stored one, and after a restart the session's unique message id replays the stored answer
  instead of asking the model again.
* *Restart recovery.* An accepted ``/chat`` message whose answer was cut off by a crash is in
  its session; the client's retry with the same key answers it then (the model is called, the
  message is not stored twice). Without a key, a crash mid-answer leaves the message in the
  history unanswered — the client saw its request fail and may send it again.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from bot.delivery.dispatcher import Dispatcher
from bot.core.handler import DirectJob, Outcome
from bot.core.inbound import Inbound
from bot.core.reply import Reply


class NotAccepting(Exception):
    """Starting up or shutting down: the message was not taken (HTTP 503)."""


class Conversations:
    def __init__(self, dispatcher: Callable[[], Dispatcher | None], *,
                 accepting: Callable[[], bool], timeout: float) -> None:
        self._dispatcher = dispatcher
        self._accepting = accepting
        self.timeout = timeout           # the reply deadline and a margin: an answer is overdue

    async def ask(self, inbound: Inbound, reply: Reply, *, timeout: float | None = None) -> Outcome:
        """Answer ``inbound`` through ``reply``; ``Outcome("timeout", …)`` when overdue.

        The job belongs to the dispatcher once submitted: a caller that gives up (timeout, a
        closed connection) does not cancel it, so the answer is still stored in its session."""
        dispatcher = self._dispatcher()
        if dispatcher is None or not self._accepting():
            raise NotAccepting()
        done: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        if not dispatcher.submit(inbound.conv_key, DirectJob(inbound, reply, done)):
            raise NotAccepting()
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout or self.timeout)
        except asyncio.TimeoutError:
            return Outcome("timeout", "no answer within the reply deadline")
