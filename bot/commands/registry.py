"""Every command, in one table: its name and aliases, the handler that answers it (and so its
family module), and who may run it. The dispatcher (bot/commands/dispatcher.py) looks every
typed command up here — a command not in this table is unknown (answered with the help text),
and an ``admin`` command is refused and audited for anyone not in ``ETHAN_ADMINS``. Apart from
the dispatcher so a newcomer reads the whole command surface in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from bot.commands.admin import AdminCommands
from bot.commands.context import Ctx
from bot.commands.help import HelpCommands
from bot.commands.memory import MemoryCommands
from bot.commands.modes import ModeCommands
from bot.commands.reminders import ReminderCommands
from bot.commands.sessions import SessionCommands


@dataclass(frozen=True, slots=True)
class Command:
    """One command: ``/name`` (or an alias; matched case-insensitively) runs ``handler``."""

    name: str
    handler: Callable[[Any, Ctx], Awaitable[str]]    # a family's method: (self, ctx) -> the answer
    aliases: tuple[str, ...] = ()
    admin: bool = False                               # ETHAN_ADMINS only; anyone else: refused, audited

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def family(self) -> str:
        """The module that holds the handler (``bot.commands.memory``, …)."""
        return self.handler.__module__


COMMANDS: tuple[Command, ...] = (
    # help: the command list (also the answer to an unknown command)
    Command("help", HelpCommands.help, aliases=("h", "?", "帮助")),
    # sessions of this conversation
    Command("new", SessionCommands.new),
    Command("sessions", SessionCommands.sessions),
    Command("resume", SessionCommands.resume),
    # what Ethan knows about the sender
    Command("memory", MemoryCommands.show_memory),
    Command("forget", MemoryCommands.forget),
    Command("correct", MemoryCommands.correct, aliases=("更正",)),
    Command("rules", MemoryCommands.rules),
    Command("profile", MemoryCommands.profile),
    Command("episodes", MemoryCommands.episodes),
    # how Ethan answers
    Command("mode", ModeCommands.mode),
    # reminders
    Command("reminders", ReminderCommands.reminders, aliases=("reminder", "提醒")),
    # admins
    Command("reset", AdminCommands.reset, admin=True),
    Command("stats", AdminCommands.stats, admin=True),
)
