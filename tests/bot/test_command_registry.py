"""The command table (bot/commands/registry.py) is the whole command surface: every command in
it has a handler on ``Commands`` (the one its family module defines), and every handler a family
defines is in it — a handler dropped from the table, or a row whose handler is gone, fails here.
The dispatcher's lookup and its admin check are built from the table."""

from __future__ import annotations

import inspect

from bot.commands.context import CommandFamily
from bot.commands.dispatcher import Commands
from bot.commands.registry import COMMANDS


def _families() -> list[type]:
    return [c for c in Commands.__mro__ if c is not Commands and issubclass(c, CommandFamily)
            and c is not CommandFamily]


def _handlers(family: type) -> dict[str, object]:
    """A family's command handlers: its public coroutine methods ``(self, ctx) -> str``."""
    out = {}
    for name, fn in vars(family).items():
        if name.startswith("_") or not inspect.iscoroutinefunction(fn):
            continue
        sig = inspect.signature(fn)
        if list(sig.parameters) == ["self", "ctx"] and sig.return_annotation in (str, "str"):
            out[name] = fn
    return out


def test_every_command_in_the_table_has_its_familys_handler():
    for command in COMMANDS:
        name = command.handler.__name__
        assert getattr(Commands, name, None) is command.handler, f"/{command.name}: no handler {name} on Commands"
        assert command.family.startswith("bot.commands."), command
        assert command.family == inspect.getmodule(command.handler).__name__


def test_every_handler_is_in_the_table():
    registered = {c.handler for c in COMMANDS}
    families = _families()
    assert len(families) >= 6
    missing = [f"{f.__module__}.{f.__name__}.{n}" for f in families for n, fn in _handlers(f).items()
               if fn not in registered]
    assert not missing, f"handlers not in bot/commands/registry.py: {missing}"


def test_names_are_unique_and_the_dispatcher_is_built_from_the_table():
    names = [n for c in COMMANDS for n in c.names]
    assert len(names) == len(set(names)), names
    assert all(n == n.casefold() for n in names)          # the dispatcher casefolds what is typed

    class _Memory:
        db = None

    class _Deps:
        memory = _Memory()

    commands = Commands(_Deps())
    assert set(commands.table) == set(names)
    assert {n: fn.__func__ for n, fn in commands.table.items()} == {n: c.handler for c in COMMANDS for n in c.names}
    assert commands.admin_only == {n for c in COMMANDS if c.admin for n in c.names} == {"reset", "stats"}
