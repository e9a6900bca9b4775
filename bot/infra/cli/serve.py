"""``ethan serve`` and ``ethan chat``: the two commands that start the bot (bot/app.py).

``_serve`` runs the server on uvloop where it is installed, a start-up failure one line;
``_chat`` runs the terminal chat (bot/infra/terminal.py). Apart from the other subcommands:
this is the only module of the command that imports the app (tests/test_layers.py
ENTRY_POINTS); the others open the database directly.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys

from bot.infra.cli.runner import EXIT_FAIL, EXIT_OK, CliError, _database_name, _user
from bot.infra.config import Settings
from bot.infra.log import configure_logging

def _loop_factory():
    """uvloop for the server (a faster event loop: ~25 % less CPU per answered message, see
    bench/README.md); the standard loop where it is not installed (Windows)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(settings: Settings) -> int:
    configure_logging(settings.ethan_log_level)
    from bot.app import serve
    from bot.delivery.replicas import ReplicaIdInUse
    from storage import DatabaseError

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(settings))
    except KeyboardInterrupt:
        pass
    except (DatabaseError, sqlite3.Error) as e:
        # A corrupt file, or another process holding the write lock past the busy timeout:
        # one line for the operator, not a traceback.
        hint = " (another process is writing to it: stop it, or wait)" if "locked" in str(e) or "busy" in str(e) else ""
        print(f"ethan: cannot start: database {_database_name(settings)}: {e}{hint}", file=sys.stderr)
        return EXIT_FAIL
    except OSError as e:
        print(f"ethan: cannot start: {e}", file=sys.stderr)
        return EXIT_FAIL
    except ReplicaIdInUse as e:
        print(f"ethan: cannot start: {e}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


# --------------------------------------------------------------------------------------
# Chat
# --------------------------------------------------------------------------------------

async def _chat(settings: Settings, user: str, resume: str | None) -> int:
    from bot.infra.terminal import ResumeError, run_chat

    user = _user(user, "--user / ETHAN_LOCAL_USER")
    try:
        await run_chat(settings, user_id=user, resume=resume)
    except ResumeError as e:
        raise CliError(str(e)) from None
    return EXIT_OK
