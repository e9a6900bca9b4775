"""How the agent answers, whatever the interface (Lark, console playground, terminal, /chat).

One ``Reply`` per inbound message. The agent calls ``working()`` once when it starts,
``stream()`` with the whole text so far while the model is still writing (an
implementation may ignore it, or show it in a streaming card), and ``finish()``
exactly once with the final text — the answer, a command's output, or an apology.

A ``finish`` that could not deliver raises ``DeliveryError``: the only failure the handler
knows about, so a transport's own errors (Lark's codes and categories) stay in its package.
"""

from __future__ import annotations

from typing import Protocol


class DeliveryError(Exception):
    """The transport did not take the final answer, after its own retries.

    ``permanent``: it never will (no permission, a request it refuses) — record the message as
    failed; otherwise the reason may pass (the service down, a token problem) and the message
    is tried again later. ``fields`` go on the handler's log line (the transport's codes)."""

    def __init__(self, reason: str, *, permanent: bool, **fields: object) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent
        self.fields = fields


class Reply(Protocol):
    async def working(self) -> None:
        """Show the user the bot is on it (a reaction, a typing line); best effort."""

    async def stream(self, text_so_far: str) -> None:
        """The answer so far, while it is being written; best effort."""

    async def finish(self, text: str) -> None:
        """The final text; delivered reliably (retried, never doubled)."""


class CollectingReply:
    """A Reply that keeps what it was given (terminal, tests, console)."""

    def __init__(self) -> None:
        self.partials: list[str] = []
        self.text: str | None = None
        self.working_shown = False

    async def working(self) -> None:
        self.working_shown = True

    async def stream(self, text_so_far: str) -> None:
        self.partials.append(text_so_far)

    async def finish(self, text: str) -> None:
        self.text = text
