"""What every command handler works with: the invocation (``Ctx``: who, where, the words, the
language, admin or not), the dependencies the app hands in (``CommandDeps``, ``RuntimeStats``),
the answer that asks before a destructive command (``Confirmation``), the small formatting
helpers the families share (``when``, ``tail``, ``parse_id``), and ``CommandFamily``, the base of
every family's handlers (the dependencies and the audit row). Apart from the families so each
family module imports it and none imports another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from bot.agent.agent import Memory
from bot.core.inbound import CHANNEL, Inbound
from bot.core.text import when as _when
from memory.governance.audit import AuditLog
from memory.scope import Scope

MAX_LISTED = 30            # facts / rules shown by one answer
_ID = re.compile(r"^#?(\d{1,18})$")


class Confirmation(str):
    """A question before a destructive command: the text asks to type ``confirm``; a transport
    with buttons (Lark's card, bot/lark/outbound/reply.py ``ask_confirm``) shows confirm/cancel
    buttons that run ``command`` (the confirmed form) for the user who asked."""

    command: str

    def __new__(cls, text: str, command: str) -> "Confirmation":
        obj = super().__new__(cls, text)
        obj.command = command
        return obj


@dataclass
class Ctx:
    """One command invocation."""

    inbound: Inbound
    name: str
    args: list[str]
    zh: bool
    admin: bool

    @property
    def user(self) -> str:
        return self.inbound.sender_id

    @property
    def private(self) -> bool:
        return self.inbound.chat_type == "p2p"

    @property
    def scope(self) -> Scope:
        return self.inbound.scope(is_admin=self.admin)

    def t(self, zh: str, en: str) -> str:
        return zh if self.zh else en

    def pick(self, pair: tuple[str, str]) -> str:
        return pair[0] if self.zh else pair[1]


WHEN = "%m-%d %H:%M"


def when(ts: float | None) -> str:
    return _when(ts, WHEN)


def tail(open_id: str) -> str:
    return "…" + open_id[-6:] if len(open_id) > 8 else open_id


def parse_id(arg: str) -> int | None:
    m = _ID.match(arg.strip())
    return int(m.group(1)) if m else None


@dataclass(frozen=True, slots=True)
class RuntimeStats:
    """What /stats shows about the running process."""

    model_calls: int
    model_failures: int
    started_at: float        # epoch seconds; 0 when not started
    # tokens per (provider, model, answers, memory.llm.Usage) since start, chat and consolidation
    usage: tuple = ()


@dataclass
class CommandDeps:
    memory: Memory
    is_admin: Callable[[str], bool]
    bot_open_id: Callable[[], Awaitable[str]]    # the bot's own id: never a /reset user target
    runtime: Callable[[], RuntimeStats]
    reminders: Any = None                         # bot.schedules.reminders.Reminders (None: no reminders)


class CommandFamily:
    """The base of every family's handlers (``bot.commands.dispatcher.Commands`` is all of them
    together): the dependencies ``Commands`` sets, and the audit row admin actions write."""

    d: CommandDeps
    mem: Memory
    db: Any
    audit: AuditLog

    async def _audit(self, ctx: Ctx, action: str, target: str = "", chat_id: str = "", detail: str = "",
                     allowed: bool = True) -> int:
        """One audit row, naming the channel the command came by (``/chat``: the operator's
        token spoke for this user id, not the user in Lark)."""
        return await self.audit.record(ctx.user, action, target, chat_id, detail, allowed,
                                       channel=CHANNEL.get(ctx.inbound.transport, ctx.inbound.transport))
