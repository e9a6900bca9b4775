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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from bot.infra.config import ConfigError, Settings, load_settings
from bot.infra.log import configure_logging
from bot.core.text import ambiguous_session, short, when

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_USER_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
SHOW_CHARS = 200

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


class CliError(Exception):
    """One line for the user, and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


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


def _user(value: str | None, what: str = "--user") -> str:
    if value is None or not _USER_ID.match(value):
        raise CliError(f"ethan: {what}: {value!r} is not a user id (an open_id such as ou_…)")
    return value


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


def _when(ts: float | None, *, seconds: bool = False) -> str:
    return when(ts, "%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", empty="-")


def _width(text: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))


async def _resolve(store: Any, ref: str, user: str | None):
    from memory.sessions.records import AmbiguousSession, SessionNotFound

    try:
        return await store.resolve(ref, user_id=user)
    except AmbiguousSession as e:
        raise CliError(ambiguous_session(ref, e, empty_time="-")) from None
    except SessionNotFound:
        who = f" of {user}" if user else ""
        if (ref or "").strip().lower() == "last":
            raise CliError(f"ethan: there is no session{who} yet") from None
        raise CliError(f"ethan: no session{who} matches {ref!r} (see: ethan session list)") from None


def _chat_label(s: Any) -> str:
    return f"{s.chat_type} {s.chat_id}" + (f"#{s.thread_id}" if s.thread_id else "")


# --------------------------------------------------------------------------------------
# ethan session …
# --------------------------------------------------------------------------------------

async def _session_list(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    db = await _open(settings)
    try:
        sessions = await SessionStore(db).list(user_id=user, limit=args.limit)
    finally:
        await db.close()
    if not sessions:
        print("no sessions" + (f" for {user}" if user else ""))
        return EXIT_OK
    rows = [("ID", "UPDATED", "MSGS", "CHAT", "TITLE")]
    for s in sessions:
        rows.append((s.id + ("" if s.closed_at else " *"), _when(s.updated_at), str(s.message_count),
                     short(_chat_label(s), 40), short(s.title, 40)))
    widths = [max(_width(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        cells = [_pad(r[0], widths[0]), _pad(r[1], widths[1]), r[2].rjust(widths[2]), _pad(r[3], widths[3]), r[4]]
        print("  ".join(cells).rstrip())
    if any(s.closed_at is None for s in sessions):
        print("(* open: the conversation's current session)")
    return EXIT_OK


async def _session_show(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    db = await _open(settings)
    try:
        store = SessionStore(db)
        s = await _resolve(store, args.id, user)
        messages = await store.messages(s.id)
    finally:
        await db.close()
    print(f"session  {s.id}")
    print(f"title    {s.title}")
    print(f"chat     {_chat_label(s)}")
    print(f"owner    {s.owner_id}")
    print(f"model    {s.model or '-'}")
    print(f"created  {_when(s.created_at, seconds=True)}")
    print(f"updated  {_when(s.updated_at, seconds=True)}")
    print(f"status   {'open' if s.closed_at is None else 'closed ' + _when(s.closed_at, seconds=True)}")
    print(f"messages {s.message_count} ({s.user_turns} from users)")
    print()
    for m in messages:
        who = m.role
        if m.role == "user" and (m.sender_name or m.sender_id):
            who += f" ({m.sender_name or m.sender_id})"
        for b in m.tool_calls or ():    # the tool round trips that led to this answer (neutral shape)
            if isinstance(b, dict) and b.get("type") == "tool_use":
                args = json.dumps(b.get("input") or {}, ensure_ascii=False)
                print(f"    → tool {b.get('name')}({short(args, SHOW_CHARS)})")
            elif isinstance(b, dict) and b.get("type") == "tool_result":
                mark = "error" if b.get("is_error") else "result"
                print(f"    ← {mark}: {short(str(b.get('content', '')), SHOW_CHARS)}")
        print(f"[{_when(m.created_at, seconds=True)}] {who}: {short(m.content, SHOW_CHARS)}")
    return EXIT_OK


async def _session_delete(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    if (args.id or "").strip().lower() == "last":
        raise CliError("ethan: name the session to delete by its id (not 'last')")
    db = await _open(settings)
    try:
        store = SessionStore(db)
        s = await _resolve(store, args.id, user)
        if not args.yes:
            question = (f"Delete session {s.id} “{short(s.title, 40)}” ({s.message_count} messages)? "
                        "This cannot be undone. [y/N] ")
            answer = await asyncio.to_thread(_ask, question)
            if answer not in ("y", "yes"):
                print("not deleted")
                return EXIT_FAIL
        from memory.governance.erase import delete_session

        counts = await delete_session(db, s.id)
    finally:
        await db.close()
    if counts is None:
        raise CliError(f"ethan: session {s.id} was already gone", EXIT_FAIL)
    print(f"deleted session {s.id} ({deleted_counts(counts)})")
    return EXIT_OK


def deleted_counts(c: dict[str, int]) -> str:
    """What a session's deletion removed, for whoever deleted it."""
    return (f"{c['messages']} messages, {c['episodes']} episodes, {c['summaries']} summaries, "
            f"{c['facts']} facts and {c.get('profile_entries', 0)} profile entries learned only there")


def _ask(question: str) -> str:
    sys.stderr.write(question)
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        sys.stderr.write("\n")
    return line.strip().lower()


async def _session_search(settings: Settings, args: argparse.Namespace) -> int:
    from memory.sessions.store import SessionStore

    user = _user(args.user) if args.user is not None else None
    query = " ".join(args.query).strip()
    if not query:
        raise CliError("ethan: empty query: type a word or phrase to search for")
    db = await _open(settings)
    try:
        try:
            hits = await SessionStore(db).search(query, user_id=user, limit=args.limit)
        except ValueError as e:
            raise CliError(f"ethan: {e}") from None
    finally:
        await db.close()
    if not hits:
        print(f"no session matches {query!r}")
        return EXIT_OK
    for h in hits:
        s = h.session
        print(f"{s.id}  {_when(s.updated_at)}  {short(s.title, 40)}")
        print(f"    {h.snippet}" + (f"  ({h.matches} messages)" if h.matches > 1 else ""))
    return EXIT_OK


async def _episodes_list(settings: Settings, args: argparse.Namespace) -> int:
    from memory.episodes.store import EpisodeStore

    user = _user(args.user)
    db = await _open(settings)
    try:
        eps = await EpisodeStore(db).list(user, limit=args.limit)
    finally:
        await db.close()
    if not eps:
        print(f"no episodes for {user}")
    for e in eps:
        _print_episode(e)
    return EXIT_OK


async def _episodes_search(settings: Settings, args: argparse.Namespace) -> int:
    from memory.episodes.store import EpisodeStore

    user = _user(args.user)
    query = " ".join(args.query).strip()
    if not query:
        raise CliError("ethan: empty query: type a word or phrase to search for")
    db = await _open(settings)
    try:
        eps = await EpisodeStore(db).search(user, query, limit=args.limit)
    finally:
        await db.close()
    if not eps:
        print(f"no episode of {user} matches {query!r}")
    for e in eps:
        _print_episode(e, score=True)
    return EXIT_OK


def _print_episode(e, *, score: bool = False) -> None:
    where = "p2p" if e.visibility == "private" else f"group {e.chat_id}"
    extra = f"  score {e.score:.3f}" if score else ""
    print(f"#{e.id}  {e.date}  {e.session_id}  ({where}, {e.turn_count} turns){extra}")
    print(f"    {short(e.summary, SHOW_CHARS)}")


EPISODE_ACTIONS = {"list": _episodes_list, "search": _episodes_search}

SESSION_ACTIONS = {"list": _session_list, "show": _session_show, "delete": _session_delete,
                   "search": _session_search}


# --------------------------------------------------------------------------------------
# ethan memory …
# --------------------------------------------------------------------------------------

async def _memory_export(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.export import export_user

    user = _user(args.user)
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise CliError(f"ethan: --out {out}: exists and is not a directory")
    db = await _open(settings)
    try:
        result = await export_user(db, user, out)
    finally:
        await db.close()
    c = result.counts
    print(f"exported {user} to {result.directory}: {c['facts']} facts, {c['procedures']} rules, "
          f"{c['profile_entries']} profile entries, {c['episodes']} episodes")
    for f in result.files:
        print(f"  {f}")
    if not any(c.values()):
        print(f"  note: nothing is stored for {user} (check the open_id; `ethan session list` shows the chats)")
    return EXIT_OK


async def _memory_import(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.export_format import ImportRefused
    from memory.governance.import_ import import_user

    user = _user(args.user)
    directory = Path(args.dir).expanduser()
    if not directory.is_dir():
        raise CliError(f"ethan: {directory}: not a directory")
    db = await _open(settings, create=True)
    try:
        try:
            result = await import_user(db, user, directory)
        except ImportRefused as e:
            raise CliError(f"ethan: import refused, nothing was imported: {e}") from None
    finally:
        await db.close()
    a, u = result.added, result.unchanged
    print(f"imported into {user} from {directory}:")
    for key, label in (("facts", "facts"), ("procedures", "rules"), ("profile_entries", "profile entries"),
                       ("episodes", "episodes")):
        print(f"  {label:<16} {a[key]} added, {u[key]} already there")
    if result.missing:
        print(f"  not in the directory (skipped): {', '.join(result.missing)}")
    if result.exported_user and result.exported_user != user:
        print(f"  note: exported from {result.exported_user}; now owned by {user}")
    return EXIT_OK


MEMORY_ACTIONS = {"export": _memory_export, "import": _memory_import}


# --------------------------------------------------------------------------------------
# ethan db copy
# --------------------------------------------------------------------------------------

async def _db_copy(settings: Settings, args: argparse.Namespace) -> int:
    from memory.governance.copy import copy_database
    from storage import database, is_database_url
    from storage.sqlite import SqliteDatabase

    if not is_database_url(args.to):
        raise CliError(f"ethan: --to {args.to!r}: not a postgresql:// URL")
    from storage.postgres import url_problem
    if problem := url_problem(args.to):         # one line naming no credential, as for ETHAN_DATABASE_URL
        raise CliError(f"ethan: --to: {problem}")
    if not settings.db_path.exists():
        raise CliError(f"ethan: no database at {settings.db_path} to copy", EXIT_FAIL)
    source = await SqliteDatabase(settings.db_path).open()
    try:
        target = await database(args.to).open()
        try:
            result = await copy_database(source, target)
        finally:
            await target.close()
    finally:
        await source.close()
    total = sum(result.counts.values())
    new = sum(result.copied.values())
    print(f"copied {settings.db_path} to PostgreSQL: {new} new rows, {total} rows in all, counts verified")
    for t, n in result.counts.items():
        print(f"  {t:<22} {n:>8}  (+{result.copied.get(t, 0)})")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# ethan backup
# --------------------------------------------------------------------------------------

async def _backup(settings: Settings, args: argparse.Namespace) -> int:
    from storage import is_database_url
    from storage.sqlite import check_file

    if is_database_url(settings.database_target):
        # SQLite's online backup API has no PostgreSQL counterpart here: the server's own
        # tool makes the consistent copy (docs/operations.md "Backup and restore").
        raise CliError(f"ethan: backup copies a SQLite file; this is {_database_name(settings)}: "
                       'use pg_dump -Fc "$ETHAN_DATABASE_URL" > ethan.dump (docs/operations.md)')

    target = Path(args.path).expanduser()
    if target.is_dir() or args.path.endswith(("/", os.sep)):
        target.mkdir(parents=True, exist_ok=True)
        target = target / time.strftime("ethan-%Y%m%d-%H%M%S.db")
    source = settings.db_path
    if target.exists():
        if target.resolve() == source.resolve():
            raise CliError("ethan: the backup cannot replace the database itself")
        if not args.force:
            raise CliError(f"ethan: {target} exists (use --force to replace it)")
    db = await _open(settings)
    part = target.with_name(target.name + ".part")
    try:
        await db.backup_to(part)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        await db.close()
    check = check_file(part)
    if check != "ok":
        part.unlink(missing_ok=True)
        raise CliError(f"ethan: the copy failed its integrity check ({check}); nothing written", EXIT_FAIL)
    os.replace(part, target)
    size = target.stat().st_size
    print(f"{target}  {size} bytes ({_human(size)}), integrity ok")
    return EXIT_OK


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
