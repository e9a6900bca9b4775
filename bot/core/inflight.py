"""Answers being written right now, by the message they answer: what a recall stops.

A recall is queued in its chat's mailbox like any event, behind the very answer it should
stop. So the intake consults this registry first (``stop``): the answer's task is cancelled
and its reply withdrawn (``Reply.withdraw``: nothing sent, or the half-streamed card deleted)
by the handler that owns it; the recall then runs in order and removes the message and what
was stored of the answer from memory, as for any recall (memory/governance/withdraw.py).

An answer already handing its final text to the transport is not cancelled mid-send (a
message whose id never came back could not be deleted): it finishes, then is withdrawn.

Process-local: with replicas, a recall that reaches another replica than the one answering
only cancels what is still pending (memory/governance/withdraw.py ``cancel_pending``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, eq=False)
class Answer:
    message_id: str
    chat_id: str
    reply: Any
    task: "asyncio.Task | None" = None
    stopped: bool = False


class InFlight:
    def __init__(self) -> None:
        self._answers: dict[str, Answer] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def start(self, message_id: str, chat_id: str, reply: Any, task: asyncio.Task) -> Answer:
        a = Answer(message_id, chat_id, reply, task)
        if message_id:
            self._answers[message_id] = a
        return a

    def end(self, a: Answer) -> None:
        if self._answers.get(a.message_id) is a:
            del self._answers[a.message_id]

    def stop(self, message_id: str, chat_id: str) -> bool:
        """The message was recalled: stop its answer if one is being written (only for the
        recall's own chat). True when there was one."""
        a = self._answers.get(message_id)
        if a is None or a.chat_id != chat_id or a.stopped:
            return False
        a.stopped = True
        # Mid-send, the final text goes out and is deleted after (see the module docstring).
        if not a.reply.finishing and a.task is not None:
            a.task.cancel()
        return True
