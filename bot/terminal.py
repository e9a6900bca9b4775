"""``ethan chat``: talk to Ethan in the terminal, through the same pipeline as Lark.

The terminal chat starts an ``EthanApp`` in this process with the Lark transport off
(a copy of the settings with no app id, the HTTP server on a free loopback port — which is
where the built-in offline model is served when there is no ``ANTHROPIC_API_KEY``). Each
line the user types becomes a synthetic Lark ``im.message.receive_v1`` event in a p2p chat
of its own (``oc_cli_<user>``), built like the console playground's and fed to
``app.intake``: inbox, dispatcher, handler, slash commands (bot/commands.py), agent and
memory are exactly Lark's. Only the reply object is the terminal's (``TerminalReply``,
registered in ``app.replies.waiting`` under the message id).

Leaving (``/exit``, ``/quit``, end of input, Ctrl-C) closes the session — the app's close
listener asks for its episode (written when the session had at least two turns) — then
stops the app, which drains the consolidation queue. ``-r`` resumes a session before the
app starts, on a connection of its own, so an unknown or ambiguous id fails fast.

Input is read on a daemon thread (``input()``, so line editing works on a TTY), one line at
a time, only once the previous answer is printed; piped input (not a TTY) works the same,
without prompts. Answers go to stdout; status lines (banner, session closed) to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import IO, Any

from bot.config import Settings
from memory.scope import conversation_key

CHAT_PREFIX = "oc_cli_"
EXIT_WORDS = ("/exit", "/quit", "／exit", "／quit")
PROMPT = "you> "
ANSWER = "ethan> "
EXTRA_WAIT = 15.0          # seconds beyond the reply deadline before giving up on an answer
RECAP_MESSAGES = 6         # messages of a resumed session shown on start
RECAP_CHARS = 200


class ResumeError(Exception):
    """``-r`` named no session this user can resume here (or several): exit code 2."""


def cli_chat_id(user_id: str) -> str:
    return CHAT_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", user_id)


def chat_settings(settings: Settings) -> Settings:
    """The terminal's settings: no Lark transport, HTTP on a free loopback port."""
    return settings.model_copy(update={"lark_app_id": "", "lark_app_secret": "", "ethan_port": 0,
                                       "ethan_host": "127.0.0.1"})


def build_cli_event(*, user_id: str, text: str, bot_open_id: str, message_id: str) -> dict:
    """A p2p ``im.message.receive_v1`` event from the local user, as the playground builds it."""
    from bot.web.api import build_event

    event = build_event(user_id=user_id, text=text, chat="p2p", mention=False, bot_open_id=bot_open_id,
                        message_id=message_id)
    event["header"]["event_id"] = "ev_cli_" + uuid.uuid4().hex
    event["header"]["app_id"] = "cli"
    message = event["event"]["message"]
    message["chat_id"] = cli_chat_id(user_id)
    message["user_agent"] = "ethan-cli"
    return event


def terminal_app(settings: Settings) -> Any:
    """An EthanApp that never answers other processes' unanswered events.

    A running ``ethan serve`` on the same database keeps the events it is answering as
    ``pending`` in the inbox; recovering them here would answer Lark messages into the
    terminal. The server answers its own on its next start. (bot.app is imported here, not
    at the top: a ``-r`` that names no session fails before the heavy imports.)
    """
    from bot.app import EthanApp

    return EthanApp(settings, recover_inbox=False)


class TerminalReply:
    """A Reply (bot/reply.py) that prints to the terminal."""

    def __init__(self, out: IO[str], *, progressive: bool) -> None:
        self.out = out
        self.progressive = progressive
        self.printed = ""          # what stream() already put on the screen
        self.started = False
        self.text: str | None = None
        self.done = asyncio.Event()

    async def working(self) -> None:
        return None

    async def stream(self, text_so_far: str) -> None:
        if not self.progressive or self.done.is_set():
            return
        if not self.started:
            self.out.write(ANSWER)
            self.started = True
        if text_so_far.startswith(self.printed):
            self.out.write(text_so_far[len(self.printed):])
        else:                         # a new round of the tool loop: start a fresh line
            self.out.write("\n" + ANSWER + text_so_far)
        self.printed = text_so_far
        self.out.flush()

    async def finish(self, text: str) -> None:
        if self.done.is_set():
            return
        self.text = text
        if self.started and text.startswith(self.printed):
            self.out.write(text[len(self.printed):] + "\n")
        elif self.started:
            self.out.write("\n" + ANSWER + text + "\n")
        else:
            self.out.write(ANSWER + text + "\n")
        self.out.flush()
        self.done.set()


class LineReader:
    """Reads stdin on a daemon thread, one line per ``read()`` (never blocks the loop, never
    keeps the process alive at exit)."""

    def __init__(self, stream: IO[str], *, prompt: str) -> None:
        self.stream = stream
        self.prompt = prompt
        self._want = threading.Semaphore(0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lines: asyncio.Queue[str | None] | None = None
        self._thread: threading.Thread | None = None

    async def read(self) -> str | None:
        """The next line without its newline, or None at end of input."""
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._lines = asyncio.Queue()
            self._thread = threading.Thread(target=self._run, name="ethan-stdin", daemon=True)
            self._thread.start()
        self._want.release()
        return await self._lines.get()

    def _run(self) -> None:
        use_input = self.stream is sys.stdin and self.stream.isatty()
        if use_input:
            with contextlib.suppress(ImportError):
                import readline  # noqa: F401  (line editing and history for input())
        while True:
            self._want.acquire()
            line: str | None
            try:
                if use_input:
                    line = input(self.prompt)
                else:
                    raw = self.stream.readline()
                    line = raw.rstrip("\r\n") if raw else None
            except (EOFError, OSError, ValueError):
                line = None
            except KeyboardInterrupt:   # not expected off the main thread; treat as end
                line = None
            self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
            if line is None:
                return


@dataclass
class ChatOutcome:
    session_id: str | None
    turns: int


class TerminalChat:
    def __init__(self, settings: Settings, *, user_id: str, resume: str | None = None,
                 stdin: IO[str] | None = None, stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None) -> None:
        self.settings = chat_settings(settings)
        self.user_id = user_id
        self.resume_ref = resume
        self.stdin = stdin or sys.stdin
        self.out = stdout or sys.stdout
        self.err = stderr or sys.stderr
        self.interactive = self.stdin.isatty()
        self.progressive = self.out.isatty()
        self.chat_id = cli_chat_id(user_id)
        self.conv_key = conversation_key(self.chat_id)
        self.app: Any = None

    def say(self, text: str) -> None:
        """A status line (stderr)."""
        print(text, file=self.err, flush=True)

    async def run(self) -> ChatOutcome:
        closed = None
        if self.resume_ref is not None:
            closed = await self._resume(self.resume_ref)     # before the app: fails fast and cheap
        self.app = terminal_app(self.settings)
        await self.app.start()
        outcome = ChatOutcome(None, 0)
        try:
            if closed is not None and self.app.queue is not None:
                self.app.queue.request_episode(closed)     # closed on the side connection: no listener heard it
            self._banner()
            try:
                await self._loop()
            except asyncio.CancelledError:                 # Ctrl-C: leave as /exit does
                if self.interactive:
                    self.out.write("\n")
                    self.out.flush()
        finally:
            try:
                outcome = await asyncio.shield(self._close())
            finally:
                await asyncio.shield(self.app.stop())
        return outcome

    def _banner(self) -> None:
        s = self.settings
        model = "offline model (no ANTHROPIC_API_KEY)" if s.offline_model else s.ethan_model
        self.say(f"Ethan terminal chat — user {self.user_id}, {model}. "
                 "/help for commands; /exit, /quit or Ctrl-D to leave.")

    async def _resume(self, ref: str) -> Any:
        """Make the session ``ref`` this conversation's active one (SessionStore.resume: the
        CLI conversation's own sessions, or the user's own p2p sessions elsewhere) and show
        its last messages. Returns the session it closed, if any (its episode is then due).
        Runs on its own connection before the app starts; ResumeError if there is no such
        session (or several)."""
        from memory.db import Database
        from memory.sessions import AmbiguousSession, SessionNotFound, SessionStore

        if not self.settings.db_path.exists():
            raise ResumeError(f"ethan: no session of {self.user_id} to resume (nothing stored yet in "
                              f"{self.settings.ethan_home})")
        db = await Database(self.settings.db_path).open()
        try:
            store = SessionStore(db, idle_timeout=self.settings.ethan_session_idle_hours * 3600)
            before = await store.active(self.conv_key)
            try:
                resumed = await store.resume(self.conv_key, ref, user_id=self.user_id)
            except AmbiguousSession as e:
                lines = [f"ethan: {ref!r} matches {e.total} sessions; type more of the id:"]
                lines += [f"  {c.id}  {_when(c.updated_at)}  {_short(c.title, 40)}" for c in e.candidates]
                if e.total > len(e.candidates):
                    lines.append(f"  … and {e.total - len(e.candidates)} more")
                raise ResumeError("\n".join(lines)) from None
            except SessionNotFound as e:
                if (ref or "").strip().lower() == "last":
                    msg = f"ethan: no session of {self.user_id} to resume"
                else:
                    msg = (f"ethan: no session {ref!r} that {self.user_id} can resume here "
                           f"(see: ethan session list --user {self.user_id})")
                raise ResumeError(msg) from e
            recent = await store.messages(resumed.id)
        finally:
            await db.close()
        self.say(f"Resumed session {resumed.id} ({resumed.user_turns} turns): {_short(resumed.title, 60)}")
        if len(recent) > RECAP_MESSAGES:
            self.say(f"(last {RECAP_MESSAGES} of {len(recent)} messages; ethan session show {resumed.tail} for all)")
        for msg in recent[-RECAP_MESSAGES:]:
            who = PROMPT if msg.role == "user" else ANSWER
            self.out.write(f"{who}{_short(msg.content, RECAP_CHARS)}\n")
        self.out.flush()
        return before if before is not None and before.id != resumed.id else None

    async def _loop(self) -> None:
        reader = LineReader(self.stdin, prompt=PROMPT if self.interactive else "")
        while True:
            line = await reader.read()
            if line is None:
                if self.interactive:
                    self.out.write("\n")
                return
            text = line.strip()
            if not text:
                continue
            if text.casefold() in EXIT_WORDS:
                return
            await self.send(text)
            if text.casefold() in ("/help", "/h", "/?", "/帮助", "／help"):
                self.say("(terminal: /exit, /quit or Ctrl-D to leave; ethan -r last resumes)")

    async def send(self, text: str) -> TerminalReply:
        """One message through intake → dispatcher → handler → command or agent; printed."""
        app = self.app
        bot_id = await app.bot_open_id()
        message_id = "om_cli_" + uuid.uuid4().hex
        event = build_cli_event(user_id=self.user_id, text=text, bot_open_id=bot_id, message_id=message_id)
        reply = TerminalReply(self.out, progressive=self.progressive)
        app.replies.waiting[message_id] = reply
        try:
            accepted = await app.intake.accept(json.dumps(event, ensure_ascii=False), event)
            if accepted.status != "accepted":
                self.say(f"ethan: message not taken ({accepted.status}: {accepted.reason or 'no reason'})")
                return reply
            status = await self._wait(reply, message_id)
            if status:
                self.say(f"ethan: {status}")
        finally:
            app.replies.waiting.pop(message_id, None)
        return reply

    async def _wait(self, reply: TerminalReply, message_id: str) -> str:
        """'' once answered; otherwise why there is no answer."""
        db = self.app.db
        deadline = time.monotonic() + float(self.settings.ethan_reply_deadline) + EXTRA_WAIT
        while True:
            try:
                await asyncio.wait_for(reply.done.wait(), 0.2)
                return ""
            except asyncio.TimeoutError:
                pass
            row = await db.fetchone("SELECT status, note FROM inbox WHERE message_id = ?", (message_id,))
            if row is not None and row["status"] in ("ignored", "failed"):
                return f"no answer ({row['note'] or row['status']})"
            if row is not None and row["status"] == "done":
                await asyncio.sleep(0)
                return "" if reply.done.is_set() else "no answer (handled without a reply)"
            if time.monotonic() > deadline:
                return "no answer within the reply deadline"

    async def _close(self) -> ChatOutcome:
        """The spec: on leaving, the session ends; >= 2 turns → an episode (the app's close
        listener asks the consolidation queue for it; ``app.stop()`` drains the queue)."""
        app = self.app
        if app is None or app.memory is None:
            return ChatOutcome(None, 0)
        info = await app.memory.sessions.close_active(self.conv_key)
        if info is None:
            return ChatOutcome(None, 0)
        self.say(f"Session {info.id} saved ({info.user_turns} turns). Resume with: ethan -r {info.tail}")
        return ChatOutcome(info.id, info.user_turns)


def _short(text: str, n: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""


async def run_chat(settings: Settings, *, user_id: str, resume: str | None = None, **streams: Any) -> ChatOutcome:
    return await TerminalChat(settings, user_id=user_id, resume=resume, **streams).run()
