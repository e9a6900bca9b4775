"""Slash commands and admin commands, answered without calling the model.

``Commands(deps).run(inbound, text)`` returns the answer, or ``None`` when ``text`` is not
a command (it does not start with ``/`` — or the full-width ``／`` a Chinese IME types —
or its first word holds another slash: ``/etc/hosts 怎么改`` is a question, not a command).
The handler calls it only for messages the bot must answer (p2p, or a group message that
mentions the bot, with the bot's @-placeholder already stripped). Command names and
keywords (``all``, ``confirm``, ``delete``, ``user``) are case-insensitive; an unknown
command gets the help text.

Everything a command shows belongs to the sender (``inbound.sender_id``): in a group,
only memory visible in groups (private, p2p-learned facts and episodes are not shown,
and the profile is only shown in a p2p chat). Bad input gets one short answer; a
command never raises (a failure is logged and answered with an apology).

Answers are Chinese when the command or the sender's latest message in this
conversation is Chinese, English otherwise.

Admin commands (``ETHAN_ADMINS``): ``/reset``, ``/reset user``, ``/stats``. Every admin
action — and every refused attempt (``allowed=0``) — is written to the audit table
(``memory/governance/audit.py``). The audit row of ``/reset user`` names the erased open_id: the one
place it remains, for accountability.

This module is the plumbing only (recognise a command, pick the language, check who may run
it, record a /chat read, never raise): the commands are in the family modules beside it, every
one listed in ``registry.py``.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from bot.commands.admin import AdminCommands
from bot.commands.context import CommandDeps, Ctx
from bot.commands.help import HelpCommands
from bot.commands.memory import MemoryCommands
from bot.commands.modes import ModeCommands
from bot.commands.registry import COMMANDS
from bot.commands.reminders import ReminderCommands
from bot.commands.sessions import SessionCommands
from bot.core.inbound import WEB_API, Inbound
from bot.core.text import is_chinese, short
from bot.infra.log import get_logger
from memory.governance.audit import AuditLog

log = get_logger("ethan.commands")

SLASHES = ("/", "／")


class Commands(HelpCommands, SessionCommands, MemoryCommands, ModeCommands, ReminderCommands, AdminCommands):
    """Every family's handlers on one object; ``run`` looks the command up in the table
    (bot/commands/registry.py) and checks who may run it."""

    def __init__(self, deps: CommandDeps) -> None:
        self.d = deps
        self.mem = deps.memory
        self.db = deps.memory.db
        self.audit = AuditLog(self.db)
        self.table: dict[str, Callable[[Ctx], Awaitable[str]]] = {
            name: getattr(self, command.handler.__name__) for command in COMMANDS for name in command.names}
        self.admin_only = frozenset(name for command in COMMANDS if command.admin for name in command.names)

    # -- plumbing ----------------------------------------------------------------------
    async def run(self, inbound: Inbound, text: str) -> str | None:
        stripped = (text or "").strip()
        if not stripped or stripped[0] not in SLASHES:
            return None
        words = stripped[1:].split()
        if words and any(c in SLASHES for c in words[0]):
            return None          # a path ("/etc/hosts …") or "//", not a command: the model answers
        name = words[0].casefold() if words else "help"
        args = words[1:]
        admin = inbound.admin(self.d.is_admin)
        zh = True
        try:
            zh = await self._chinese(inbound, stripped)
            ctx = Ctx(inbound, name, args, zh, admin)
            log.info("command.run", command=name[:32], chat_id=inbound.chat_id, user_id=inbound.sender_id,
                     chat_type=inbound.chat_type, message_id=inbound.message_id)
            handler = self.table.get(name)
            if handler is None:
                return ctx.t(f"未知命令 /{short(name, 20)}。\n", f"Unknown command /{short(name, 20)}.\n") \
                    + await self.help(ctx)
            if name in self.admin_only and not admin:
                return await self._refuse(ctx)
            if inbound.transport == WEB_API and name in ("memory", "profile", "episodes", "rules"):
                # The /chat token holder reads any user's memory (an operator): on the record.
                await self._audit(ctx, f"{name} read", ctx.user, inbound.chat_id, "", allowed=True,
                                        )
            return await handler(ctx)
        except Exception:  # noqa: BLE001 - a command never takes the handler down
            log.exception("command.failed", command=name[:32], chat_id=inbound.chat_id,
                          user_id=inbound.sender_id)
            return "抱歉，命令没有执行成功，请稍后再试。" if zh else "Sorry — that command failed; please try again."

    async def _chinese(self, inbound: Inbound, text: str) -> bool:
        if is_chinese(text):
            return True
        last = await self.mem.sessions.last_user_text(inbound.conv_key, inbound.sender_id)
        return last is not None and is_chinese(last)

    async def _refuse(self, ctx: Ctx) -> str:
        user_form = ctx.name == "reset" and bool(ctx.args) and ctx.args[0].casefold() in ("user", "用户")
        action = "reset user" if user_form else ctx.name
        log.warning("command.refused", command=ctx.name, chat_id=ctx.inbound.chat_id, user_id=ctx.user,
                    reason="not an admin")
        await self._audit(ctx, action, "", ctx.inbound.chat_id, "refused: not an admin",
                                allowed=False)
        return ctx.t("抱歉，这是管理员命令，你没有权限。", "Sorry — that is an admin command, and you are not an admin.")
