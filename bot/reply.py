"""How the agent answers, whatever the interface (Lark, console playground, terminal).

One ``Reply`` per inbound message. The agent calls ``working()`` once when it starts,
``stream()`` with the whole text so far while the model is still writing (an
implementation may ignore it, or show it in a streaming card), and ``finish()``
exactly once with the final text — the answer, a command's output, or an apology.
"""

from __future__ import annotations

from typing import Protocol


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
