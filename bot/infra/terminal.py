"""``ethan chat``: talk to Ethan in the terminal, through the same pipeline as Lark.

The terminal chat starts an ``EthanApp`` in this process with the Lark transport off
(a copy of the settings with no app id, the HTTP server on a free loopback port — which is
where the built-in offline model is served when no model is configured). Each
line the user types becomes a neutral ``Inbound`` (bot/core/inbound.py) in a p2p chat of its own
(``oc_cli_<user>``), handed to ``app.conversations.ask`` with this line's ``TerminalReply``:
dispatcher, handler, slash commands (bot/commands/), agent and memory are exactly Lark's;
no Lark event is made up and nothing goes to Lark's inbox.

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
import re
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from bot.infra.config import Settings
from bot.core.inbound import TERMINAL, typed_message
from bot.core.reply import ReplyBase
from bot.core.text import ambiguous_session, short as _short
from memory.scope import conversation_key

if TYPE_CHECKING:
    from bot.app import EthanApp
    from memory.sessions.records import SessionInfo

CHAT_PREFIX = "oc_cli_"
EXIT_WORDS = ("/exit", "/quit", "／exit", "／quit")
PROMPT = "you> "
ANSWER = "ethan> "
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


def terminal_app(settings: Settings) -> "EthanApp":
    """An EthanApp that never answers other processes' unanswered events.

    A running ``ethan serve`` on the same database keeps the events it is answering as
    ``pending`` in the inbox; recovering them here would answer Lark messages into the
    terminal. The server answers its own on its next start. (bot.app is imported here, not
    at the top: a ``-r`` that names no session fails before the heavy imports.)
    """
    from bot.app import EthanApp

    return EthanApp(settings, recover_inbox=False)


class TerminalReply(ReplyBase):
    """A Reply (bot/core/reply.py) that prints to the terminal."""

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
        rest = _unprinted(self.printed, text) if self.started else None
        if rest is not None:
            self.out.write(rest + "\n")
        elif self.started:
            self.out.write("\n" + ANSWER + text + "\n")
        else:
            self.out.write(ANSWER + text + "\n")
        self.out.flush()
        self.done.set()


def _unprinted(printed: str, text: str) -> str | None:
    """What of the final ``text`` is not on the screen yet, or None if the screen shows
    something else. The tool loop (bot/agent/loop.py) strips each round's text, so a stream
    whose last delta ends in a space is the answer plus that space, not another answer."""
    if text.startswith(printed):
        return text[len(printed):]
    shown, body = printed.strip(), text.strip()
    if not body.startswith(shown):
        return None
    return body[len(shown):].removeprefix(printed[len(printed.rstrip()):])


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
        self.app: "EthanApp | None" = None

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
        model = "offline model (no model configured)" if s.offline_model else s.ethan_model
        self.say(f"Ethan terminal chat — user {self.user_id}, {model}. "
                 "/help for commands; /exit, /quit or Ctrl-D to leave.")

    async def _resume(self, ref: str) -> "SessionInfo | None":
        """Make the session ``ref`` this conversation's active one (SessionStore.resume: the
        CLI conversation's own sessions, or the user's own p2p sessions elsewhere) and show
        its last messages. Returns the session it closed, if any (its episode is then due).
        Runs on its own connection before the app starts; ResumeError if there is no such
        session (or several)."""
        from memory.sessions.records import AmbiguousSession, SessionNotFound
        from memory.sessions.store import SessionStore

        if not self.settings.ethan_database_url and not self.settings.db_path.exists():
            raise ResumeError(f"ethan: no session of {self.user_id} to resume (nothing stored yet in "
                              f"{self.settings.ethan_home})")
        db = await self.settings.open_database().open()
        try:
            store = SessionStore(db, idle_timeout=self.settings.ethan_session_idle_hours * 3600)
            before = await store.active(self.conv_key)
            try:
                resumed = await store.resume(self.conv_key, ref, user_id=self.user_id)
            except AmbiguousSession as e:
                raise ResumeError(ambiguous_session(ref, e)) from None
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
        """One message through dispatcher → handler → command or agent; printed."""
        inbound = typed_message(transport=TERMINAL, message_id="om_cli_" + uuid.uuid4().hex,
                                chat_id=self.chat_id, sender_id=self.user_id, text=text)
        reply = TerminalReply(self.out, progressive=self.progressive)
        from bot.delivery.direct import NotAccepting

        try:
            outcome = await self.app.conversations.ask(inbound, reply)
        except NotAccepting:
            self.say("ethan: message not taken (the bot is not accepting messages right now)")
            return reply
        if outcome.status == "ignored":
            self.say(f"ethan: no answer ({outcome.reason})")
        elif outcome.status != "answered":
            self.say(f"ethan: {outcome.reason or 'no answer'}")
        return reply

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


async def run_chat(settings: Settings, *, user_id: str, resume: str | None = None,
                   **streams: IO[str]) -> ChatOutcome:
    return await TerminalChat(settings, user_id=user_id, resume=resume, **streams).run()
