"""How the agent answers, whatever the interface (Lark, console playground, terminal, /chat).

One ``Reply`` per inbound message. The agent calls ``working()`` once when it starts,
``stream()`` with the whole text so far while the model is still writing (an
implementation may ignore it, or show it in a streaming card), and ``finish()``
exactly once with the final text — the answer, a command's output, or an apology.

What else a reply offers it declares in ``capabilities`` (``Capability``: the console's
memory panel, Lark's confirm buttons, /chat's failure status); the agent and the handler ask
that set, never probe the object. ``ReplyBase`` gives the optional members' neutral behaviour.

A ``finish`` that could not deliver raises ``DeliveryError``: the only failure the handler
knows about, so a transport's own errors (Lark's codes and categories) stay in its package.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol


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


class Capability(enum.Enum):
    """What a ``Reply`` may offer beyond working/stream/finish. The value names the member it
    promises; a reply declares what it offers in ``capabilities`` and callers ask that set,
    never the object (tests/bot/test_reply_contract.py: declared ⇔ implemented)."""

    MEMORY_PANEL = "show_memory"        # show_memory(blocks): what memory put in the prompt (console, /chat)
    TOOL_PANEL = "show_tools"           # show_tools(tools): the tool calls of the answer (console)
    CONFIRM_TOOL = "confirm_tool"       # await confirm_tool(name, args) -> bool: the asker's click (Lark)
    CONFIRM_COMMAND = "ask_confirm"     # await ask_confirm(text, command=, user_id=, chat_type=): buttons (Lark)
    MEMORY_CARD = "memory_card"         # await memory_card(view, chat_type=): /memory with Forget/Correct (Lark)
    FAILURE_STATUS = "note_failure"     # note_failure(kind): the interface answers a model failure
                                        # with its own status (/chat's 503), not only the apology
    WITHDRAW = "withdraw"               # await withdraw() -> int: a recalled message's half answer
                                        # taken back from the chat (Lark: the streaming card deleted)


class Reply(Protocol):
    capabilities: frozenset[Capability]

    async def working(self) -> None:
        """Show the user the bot is on it (a reaction, a typing line); best effort."""

    async def stream(self, text_so_far: str) -> None:
        """The answer so far, while it is being written; best effort."""

    async def finish(self, text: str) -> None:
        """The final text; delivered reliably (retried, never doubled)."""

    @property
    def delivered(self) -> bool:
        """The final answer reached the transport for good (a turn cancelled after this must
        not be answered again)."""

    # -- optional: called only when ``capabilities`` says so ------------------------------
    def show_memory(self, blocks: Any) -> None: ...
    def show_tools(self, tools: list[dict]) -> None: ...
    async def confirm_tool(self, name: str, args: dict) -> bool: ...
    async def ask_confirm(self, text: str, *, command: str, user_id: str, chat_type: str) -> None: ...
    async def memory_card(self, view: Any, *, chat_type: str) -> None: ...
    def note_failure(self, kind: str) -> None: ...
    async def withdraw(self) -> int: ...


class ReplyBase:
    """The optional members' neutral behaviour, for replies that do not offer them: a caller
    that asks ``capabilities`` never reaches these, one that does not still gets something
    sane (no panel, no click: a tool call is not confirmed, a question is plain text)."""

    capabilities: frozenset[Capability] = frozenset()

    @property
    def delivered(self) -> bool:
        return False

    def show_memory(self, blocks: Any) -> None:
        return None

    def show_tools(self, tools: list[dict]) -> None:
        return None

    async def confirm_tool(self, name: str, args: dict) -> bool:
        return False

    async def ask_confirm(self, text: str, *, command: str, user_id: str, chat_type: str) -> None:
        await self.finish(text)     # type: ignore[attr-defined]

    async def memory_card(self, view: Any, *, chat_type: str) -> None:
        await self.finish(str(view))     # type: ignore[attr-defined]

    def note_failure(self, kind: str) -> None:
        return None

    async def withdraw(self) -> int:
        return 0        # nothing reached anyone to take back

    @property
    def finishing(self) -> bool:
        """Part of WITHDRAW (bot/core/inflight.py): the final text is being handed over, so a recall
        lets it finish and withdraws it after. Nothing here is sent in a way a cancel could cut."""
        return False


class CollectingReply(ReplyBase):
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
