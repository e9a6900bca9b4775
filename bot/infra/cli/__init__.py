"""The ``ethan`` command (also ``python -m bot``).

    ethan serve                           the bot: Lark transport, web console, API
    ethan chat [--user U] [-r ID]         terminal chat (same pipeline as Lark)
    ethan -r last | ethan -r <id>         resume a session in the terminal chat
    ethan session list|show|delete|search the stored sessions (layer 1)
    ethan episodes list|search    one user's episodes (layer 4), as recall ranks them
    ethan memory export|import            one user's memory as the spec's files
    ethan backup PATH                     a consistent copy of the database

Bare ``ethan`` runs the server, as before. Errors a user can fix (bad configuration, an
unknown or ambiguous session id, a refused import) are one line on stderr and exit code 2;
never a traceback. The session, memory and backup commands open the database directly:
no server needed, and safe while one runs (WAL, busy timeout, one short transaction each).

The package: this module is the parser and ``main`` (what ``ethan`` and ``python -m bot``
run); each command family is a module of its own — ``serve.py`` (serve, chat), ``sessions.py``,
``episodes.py``, ``memory_files.py`` (memory export/import), ``database.py`` (db copy, backup)
— and ``runner.py`` is what they share (one-line errors, exit codes, opening the database).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bot.infra.cli.database import _backup, _db_copy
from bot.infra.cli.episodes import EPISODE_ACTIONS
from bot.infra.cli.memory_files import MEMORY_ACTIONS
from bot.infra.cli.runner import EXIT_USAGE, _run
from bot.infra.cli.serve import _chat, _serve
from bot.infra.cli.sessions import SESSION_ACTIONS
from bot.infra.config import ConfigError, load_settings

EPILOG = """\
examples:
  ethan serve                              run the bot (Lark, web console at http://127.0.0.1:8080/)
  ethan chat                               chat in the terminal as $ETHAN_LOCAL_USER (default ou_local)
  ethan -r last                            resume your most recent session in the terminal
  ethan -r d139                            resume a session by its id or the last characters of it
  ethan session list --user ou_xxx         sessions that user took part in (all users without --user)
  ethan session show d139                  a session's messages
  ethan session search 乌龙茶               sessions whose messages or title contain the words
  ethan memory export --user ou_xxx --out DIR
  ethan memory import --user ou_xxx DIR
  ethan backup /backups/ethan.db           consistent copy while the server runs

With no model configured (ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL) the built-in
offline model answers (its answers start with [offline]). `make run` installs this command as
.venv/bin/ethan (not on PATH).
Data lives in $ETHAN_HOME (default ~/.ethan); `python -m bot` is the same command."""


# --------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ethan", description="Ethan: a Lark/Feishu bot with a four-layer memory",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-r", "--resume", metavar="ID",
                   help="resume a session in the terminal chat: 'last', a session id, or its last characters")
    p.add_argument("--user", dest="global_user", metavar="OPEN_ID",
                   help="the terminal chat's user (default: ETHAN_LOCAL_USER, ou_local)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("serve", help="run the bot: Lark transport, web console, API (the default)",
                   description="Run the bot until SIGTERM/SIGINT: Lark transport, web console, /healthz, /metrics.")

    chat = sub.add_parser("chat", help="chat in the terminal (same agent, commands and memory as Lark)",
                          description="Chat with Ethan in the terminal. Slash commands work as in Lark "
                                      "(/help, /new, /sessions, /resume <id>, /memory, …); /exit, /quit or "
                                      "Ctrl-D leaves, closing the session (and writing its episode).")
    chat.add_argument("--user", metavar="OPEN_ID", help="who you are (default: ETHAN_LOCAL_USER, ou_local)")
    chat.add_argument("-r", "--resume", dest="chat_resume", metavar="ID", help="resume a session first")

    session = sub.add_parser("session", help="list, show, delete or search stored sessions",
                             description="The stored sessions (layer 1). IDs: the full id "
                                         "(s_20260611_1753_d139), its last characters (d139), or 'last'.")
    ss = session.add_subparsers(dest="action", metavar="ACTION")
    ss.required = True
    sl = ss.add_parser("list", help="most recently active sessions")
    sl.add_argument("--user", metavar="OPEN_ID", help="only sessions of conversations this user took part in")
    sl.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    sh = ss.add_parser("show", help="a session and a summary of its messages")
    sh.add_argument("id", help="session id, its last characters, or 'last'")
    sh.add_argument("--user", metavar="OPEN_ID", help="resolve among this user's sessions only")
    sd = ss.add_parser("delete", help="delete a session and its messages (asks first)")
    sd.add_argument("id", help="session id or its last characters")
    sd.add_argument("--user", metavar="OPEN_ID", help="resolve among this user's sessions only")
    sd.add_argument("-y", "--yes", action="store_true", help="do not ask")
    sq = ss.add_parser("search", help="sessions whose messages or title contain the query")
    sq.add_argument("query", nargs="+", help="words to find (matched literally)")
    sq.add_argument("--user", metavar="OPEN_ID", help="only this user's sessions")
    sq.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")

    episodes = sub.add_parser("episodes", help="list or search one user's episodes (layer 4)",
                              description="A user's episodes: one per finished session, indexed by its "
                                          "summary and what was said (ranking: RRF of BM25 over both).")
    es = episodes.add_subparsers(dest="action", metavar="ACTION")
    es.required = True
    el = es.add_parser("list", help="the user's newest episodes")
    el.add_argument("--user", required=True, metavar="OPEN_ID", help="whose episodes")
    el.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    eq = es.add_parser("search", help="the user's episodes that best match the query")
    eq.add_argument("query", nargs="+", help="words to find")
    eq.add_argument("--user", required=True, metavar="OPEN_ID", help="whose episodes")
    eq.add_argument("--limit", type=_positive, default=5, help="how many (default 5)")

    memory = sub.add_parser("memory", help="export or import one user's memory (the spec's files)",
                            description="One user's memory as facts.json, procedures.json, user_profile.md, "
                                        "episodes.json (+ manifest.json with the profile's provenance).")
    ms = memory.add_subparsers(dest="action", metavar="ACTION")
    ms.required = True
    me = ms.add_parser("export", help="write a user's memory to a directory")
    me.add_argument("--user", required=True, metavar="OPEN_ID", help="whose memory")
    me.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if needed)")
    mi = ms.add_parser("import", help="read an export directory into a user's memory (validated, all or nothing)")
    mi.add_argument("--user", required=True, metavar="OPEN_ID", help="who will own the imported memory")
    mi.add_argument("dir", metavar="DIR", help="an export directory")

    dbp = sub.add_parser("db", help="copy the SQLite database into PostgreSQL",
                         description="Copy $ETHAN_HOME/ethan.db into the PostgreSQL database at URL "
                                     "(migrated first): idempotent, row counts verified.")
    dbs = dbp.add_subparsers(dest="action", metavar="ACTION")
    dbs.required = True
    dc = dbs.add_parser("copy", help="copy every table into PostgreSQL (safe to run again)")
    dc.add_argument("--to", required=True, metavar="URL", help="postgresql://user:pass@host:5432/db")

    backup = sub.add_parser("backup", help="consistent copy of the database (safe while the server runs)",
                            description="Copy the database with SQLite's online backup API (consistent while "
                                        "the server writes), check the copy's integrity, print its path and "
                                        "size. PATH may be a directory (existing, or ending in /): a "
                                        "timestamped ethan-YYYYmmdd-HHMMSS.db is made in it.")
    backup.add_argument("path", metavar="PATH", help="file to write, or a directory")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")
    return p


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


# --------------------------------------------------------------------------------------
# Entry
# --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Memory is personal: whatever the shell's umask, what Ethan creates (the database, its
    # WAL, backups, exports, logs) is its user's only: directories 0700, files 0600.
    os.umask(0o077)
    try:
        settings = load_settings()
    except ConfigError as e:
        print(f"ethan: configuration error: {e}", file=sys.stderr)
        return EXIT_USAGE
    _private_home(settings.ethan_home)
    command = args.command
    resume = args.resume if command in (None, "chat") else None
    if command == "chat" and args.chat_resume:
        resume = args.chat_resume
    if command is None and resume:
        command = "chat"
    if command in (None, "serve"):
        return _serve(settings)
    if command == "chat":
        user = getattr(args, "user", None) or args.global_user or settings.ethan_local_user
        return _run(lambda: _chat(settings, user, resume), settings, quiet=True)
    if command == "session":
        return _run(lambda: SESSION_ACTIONS[args.action](settings, args), settings)
    if command == "episodes":
        return _run(lambda: EPISODE_ACTIONS[args.action](settings, args), settings)
    if command == "memory":
        return _run(lambda: MEMORY_ACTIONS[args.action](settings, args), settings)
    if command == "backup":
        return _run(lambda: _backup(settings, args), settings)
    if command == "db":
        return _run(lambda: _db_copy(settings, args), settings)
    print(f"ethan: unknown command {command!r}", file=sys.stderr)
    return EXIT_USAGE


def _private_home(home: Path) -> None:
    """ETHAN_HOME 0700, also when an earlier version (or a umask of 022) made it 0755."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        if home.stat().st_uid == os.geteuid() and home.stat().st_mode & 0o077:
            home.chmod(0o700)
    except OSError:
        pass    # reported by whatever needs the folder, with its path
