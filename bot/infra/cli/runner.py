"""How one ``ethan`` subcommand runs: one-line errors, exit codes, quiet logs, the database.

``CliError`` (one line for the user, and an exit code), ``_run`` (a command's event loop, its
errors turned into one line on stderr), the logging a short command or the terminal chat wants,
``_user`` (a user id argument checked), ``_open`` (the database, opened directly: no server
needed) and ``_database_name`` (the database named without its password). Apart: what every
subcommand module (serve, sessions, episodes, memory_files, database) shares, so that none of
them imports another and the package's ``main`` imports them all.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import sys
from typing import Awaitable, Callable

from bot.infra.config import Settings
from bot.infra.log import configure_logging

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
SHOW_CHARS = 200


class CliError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _user(value: str | None, what: str = "--user") -> str:
    if value is None or not _USER_ID.match(value):
        raise CliError(f"ethan: {what}: {value!r} is not a user id (an open_id such as ou_…)")
    return value


def _database_name(settings: Settings) -> str:
    """The database for an operator's error line: the SQLite file, or PostgreSQL's host and
    database name — never the URL itself, which may carry a password."""
    from urllib.parse import urlsplit

    from storage import is_database_url

    target = settings.database_target
    if not is_database_url(target):
        return str(target)
    u = urlsplit(str(target))
    return f"PostgreSQL {u.hostname or 'localhost'}:{u.port or 5432}{u.path or ''}"


def _run(make: Callable[[], Awaitable[int | None]], settings: Settings, *, quiet: bool = False) -> int:
    """Run one command: one-line errors, exit codes, logs kept out of the way."""
    from storage import DatabaseError

    _configure_quiet_logging(settings, chat=quiet)
    try:
        code = asyncio.run(make())
    except CliError as e:
        print(str(e), file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except (DatabaseError, sqlite3.Error) as e:
        print(f"ethan: database {settings.db_path}: {e}", file=sys.stderr)
        return EXIT_FAIL
    except OSError as e:
        print(f"ethan: {e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK if code is None else code


def _configure_quiet_logging(settings: Settings, *, chat: bool) -> None:
    """The terminal is for the conversation and the command's output: logs go to
    $ETHAN_HOME/logs/cli.log (chat) or, for the short commands, only warnings to stderr."""
    if chat:
        try:
            logs = settings.ethan_home / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            stream = open(logs / "cli.log", "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError:
            stream = None
        if stream is not None:
            configure_logging(settings.ethan_log_level, json=True, stream=stream)
            return
        configure_logging("error")
        return
    explicit = "ethan_log_level" in settings.model_fields_set
    configure_logging(settings.ethan_log_level if explicit else "warning")


# --------------------------------------------------------------------------------------
# Database helpers
# --------------------------------------------------------------------------------------

async def _open(settings: Settings, *, create: bool = False):
    from storage import is_database_url

    if is_database_url(settings.database_target):
        return await settings.open_database().open()
    path = settings.db_path
    if not create and not path.exists():
        raise CliError(f"ethan: no database at {path} yet (set ETHAN_HOME to where Ethan keeps its data)",
                       EXIT_FAIL)
    return await settings.open_database().open()
