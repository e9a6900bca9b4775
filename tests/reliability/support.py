"""Shared tools for the reliability suite (tests/reliability).

- :class:`ServerProcess` runs ``python -m bot serve`` in a subprocess against the wire fakes
  (which live in the test process, on their own threads, and outlive the server), so a test
  can SIGKILL or SIGTERM it. Its stderr (JSON log lines) goes to a file the test reads.
- :func:`post_event` sends one signed, encrypted webhook request and reports whether the
  sender got its acknowledgement (HTTP 200), or ``None`` when the connection failed.
- :class:`LogCapture` captures the in-process app's structlog events and stdlib log records,
  for the Harness-based tests that check "no errors in the log".
- :func:`deliveries_by_trigger` / :func:`reply_uuids_by_trigger` read the fake Lark's
  records: deliveries (after uuid dedup) and the uuids the bot used, per triggering message.

Everything here is bounded: every wait has a timeout, every loop a limit.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import aiohttp
import structlog

from tests.fakes.fake_anthropic import FakeAnthropic
from tests.fakes.fake_lark import FakeLark
from tests.fakes.lark_events import webhook_request
from tests.harness import BOT_OPEN_ID, ENCRYPT_KEY, VERIFICATION_TOKEN

REPO = Path(__file__).resolve().parents[2]
ERROR_LEVELS = frozenset({"error", "critical", "exception", "fatal"})
KILL_MARKER = "test.server_killed"   # written by ServerProcess.kill() after the process is gone
_STDLIB_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):([\w.]+):(.*)$")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------
# The server in a subprocess
# ------------------------------------------------------------------------------------------


class ServerProcess:
    """``python -m bot serve`` with the documented environment, against the fakes.

    Each ``start()`` picks a fresh port (a killed server's port may linger) and appends the
    process's stderr to ``<home>/server.log``; ``entries()`` parses the JSON lines.
    """

    def __init__(self, home: Path, lark: FakeLark, model: FakeAnthropic, **env: str) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.lark = lark
        self.model = model
        self.extra_env = {k.upper(): str(v) for k, v in env.items()}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = self.home / "server.log"
        self.starts = 0
        self._log_file = None
        self.command = [sys.executable, "-m", "bot", "serve"]   # tests of this class run another

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.home / "ethan.db"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("LARK_", "ETHAN_", "ANTHROPIC_"))}
        env.update({
            "PYTHONPATH": str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
            "PYTHONUNBUFFERED": "1",
            "LARK_APP_ID": "cli_test",
            "LARK_APP_SECRET": "test-secret",
            "LARK_DOMAIN": self.lark.base_url,
            "LARK_TRANSPORT": "webhook",
            "LARK_ENCRYPT_KEY": ENCRYPT_KEY,
            "LARK_VERIFICATION_TOKEN": VERIFICATION_TOKEN,
            "ANTHROPIC_API_KEY": "x",
            "ANTHROPIC_BASE_URL": self.model.base_url,
            "ETHAN_HOME": str(self.home),
            "ETHAN_HOST": "127.0.0.1",
            "ETHAN_PORT": str(self.port),
            "ETHAN_MODEL": "claude-sonnet-4-6",
            "ETHAN_LOG_LEVEL": "info",
        })
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.port = free_port()
        self.starts += 1
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f'{{"event": "test.server_start", "run": {self.starts}}}\n'.encode())
        self._log_file.flush()
        # cwd = the data directory: no stray .env from the developer's checkout is read.
        self.proc = subprocess.Popen(
            self.command, cwd=self.home, env=self.env(),
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=self._log_file,
        )

    async def wait_ready(self, timeout: float = 30.0) -> float:
        """Until GET /healthz answers 200; returns the seconds it took."""
        t0 = time.monotonic()
        async with aiohttp.ClientSession() as http:
            while time.monotonic() - t0 < timeout:
                if self.proc is None or self.proc.poll() is not None:
                    raise AssertionError(f"server exited ({self.proc and self.proc.returncode}) "
                                         f"before it was ready:\n{self.tail()}")
                try:
                    async with http.get(self.url + "/healthz",
                                        timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return time.monotonic() - t0
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError(f"server not ready within {timeout}s:\n{self.tail()}")

    async def start_ready(self, timeout: float = 30.0) -> float:
        self.start()
        return await self.wait_ready(timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs in the server."""
        killed = self.proc is not None and self.proc.poll() is None
        if killed:
            self.proc.send_signal(signal.SIGKILL)
        self._reap(10)
        if killed:
            self._mark_kill()

    def _mark_kill(self) -> None:
        """End the killed run's output with a newline and a marker line. The kill can land
        inside a log write: print() writes the line and its newline separately, so the last
        line may lack its newline (the next run's first line would be glued onto it) or be
        cut mid-JSON. ``entries()`` reads the line before the marker as possibly cut."""
        with open(self.log_path, "ab") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() and not self._ends_with_newline():
                f.write(b"\n")
            f.write(f'{{"event": "{KILL_MARKER}", "run": {self.starts}}}\n'.encode())

    def _ends_with_newline(self) -> bool:
        with open(self.log_path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    async def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM and wait for exit; (return code, seconds from signal to exit)."""
        assert self.proc is not None
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None and time.monotonic() - t0 < timeout:
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - t0
        if self.proc.poll() is None:
            self.kill()
            raise AssertionError(f"server ignored SIGTERM for {timeout}s:\n{self.tail()}")
        code = self.proc.returncode
        self._reap(5)
        return code, elapsed

    def _reap(self, timeout: float) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def close(self) -> None:
        """Teardown: never leave a server behind."""
        self.kill()

    # -- logs ---------------------------------------------------------------------------
    def lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()

    def entries(self) -> list[dict]:
        """Every log line; a line that is not JSON (a traceback printed by Python itself)
        becomes ``{"level": "raw", "event": <line>}`` so it cannot hide -- except the last
        line of a SIGKILLed run, which the kill may have cut: that one becomes
        ``{"level": "cut", ...}`` (not an error; it is still there to read)."""
        out = []
        lines = self.lines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if i + 1 < len(lines) and _is_kill_marker(lines[i + 1]) and not _is_json_object(line):
                out.append({"level": "cut", "event": line})
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise ValueError
            except ValueError:
                stdlib = _STDLIB_LINE.match(line)
                if stdlib:   # logging.basicConfig's format: LEVEL:logger:message
                    item = {"level": stdlib[1].lower(), "logger": stdlib[2], "event": stdlib[3],
                            "format": "stdlib-text"}
                else:
                    item = {"level": "raw", "event": line}
            out.append(item)
        return out

    def errors(self, *, ignore: Iterable[str] = ()) -> list[dict]:
        """Error-level lines, ``dispatch.job_failed``, and lines that are neither JSON nor
        stdlib-formatted (a traceback Python printed by itself); minus events in ``ignore``."""
        skip = {"test.server_start", KILL_MARKER, *ignore}
        return [e for e in self.entries()
                if (str(e.get("level", "")).lower() in ERROR_LEVELS or e.get("level") == "raw"
                    or e.get("event") == "dispatch.job_failed") and e.get("event") not in skip]

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines()[-n:])


# ------------------------------------------------------------------------------------------
# Sending
# ------------------------------------------------------------------------------------------


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _is_kill_marker(line: str) -> bool:
    return line.startswith('{"event": "' + KILL_MARKER + '"')


async def post_event(http: aiohttp.ClientSession, url: str, event: dict, *,
                     timeout: float = 10.0) -> int | None:
    """POST one event as Lark would; the HTTP status, or None when no answer came back."""
    headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
    t0 = time.monotonic()
    try:
        async with http.post(url + "/lark/events", data=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
        POST_ERRORS.append(f"{type(e).__name__}: {e} after {time.monotonic() - t0:.2f}s")
        return None


POST_ERRORS: list[str] = []      # why post_event returned None (for failure messages)


def bot_mention() -> dict:
    return {"key": "@_user_bot", "id": {"open_id": BOT_OPEN_ID, "union_id": "on_bot", "user_id": ""},
            "name": "Ethan", "mentioned_type": "bot", "tenant_key": "tk_demo"}


# ------------------------------------------------------------------------------------------
# Reading the fakes
# ------------------------------------------------------------------------------------------


def deliveries_by_trigger(lark: FakeLark) -> collections.Counter:
    """How many distinct messages (after uuid dedup) the bot delivered per triggering message."""
    return collections.Counter(m.reply_to for m in lark.messages() if m.reply_to)


def reply_uuids_by_trigger(lark: FakeLark, *, msg_types: Iterable[str] = ("text", "post")) -> dict[str, set[str]]:
    """Every uuid the bot sent on the reply API per triggering message (including failed and
    retried attempts), for the given message types."""
    types = set(msg_types)
    out: dict[str, set[str]] = collections.defaultdict(set)
    for c in lark.calls_to("/reply", "POST"):
        if not isinstance(c.json, dict) or c.json.get("msg_type") not in types:
            continue
        mid = c.path.split("/messages/")[1].split("/")[0]
        out[mid].add(str(c.json.get("uuid")))
    return dict(out)


def sqlite_rows(db_path: Path, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
    """Read the database from the test process (the server is stopped or killed)."""
    conn = sqlite3.connect(str(db_path), timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql, params).fetchall())
    finally:
        conn.close()


def integrity(db_path: Path) -> str:
    return " ".join(r[0] for r in sqlite_rows(db_path, "PRAGMA integrity_check"))


# ------------------------------------------------------------------------------------------
# Logs of the in-process app
# ------------------------------------------------------------------------------------------


class _Handler(logging.Handler):
    def __init__(self, sink: list[dict]) -> None:
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.threadName.startswith(("FakeLark", "FakeAnthropic")):
            return       # the fakes' own servers (e.g. writing to a connection the app closed)
        self.sink.append({"level": record.levelname.lower(), "event": record.getMessage(),
                          "logger": record.name, "exc_info": bool(record.exc_info)})


class LogCapture:
    """Capture structlog events (all levels) and stdlib records (WARNING and up)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self._old: dict[str, Any] | None = None
        self._handler = _Handler(self.entries)

    def _capture(self, _, method: str, event_dict: dict) -> Any:
        event_dict.setdefault("level", method)
        self.entries.append(dict(event_dict))
        raise structlog.DropEvent

    def __enter__(self) -> "LogCapture":
        self._old = structlog.get_config()
        structlog.configure(
            processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                        structlog.processors.format_exc_info, self._capture],
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            logger_factory=structlog.PrintLoggerFactory(),
            cache_logger_on_first_use=False,
        )
        logging.getLogger().addHandler(self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger().removeHandler(self._handler)
        if self._old is not None:
            structlog.configure(**self._old)

    def events(self, name: str) -> list[dict]:
        return [e for e in self.entries if e.get("event") == name]

    def errors(self, *, ignore: Iterable[str] = ()) -> list[dict]:
        skip = set(ignore)
        return [e for e in self.entries
                if (str(e.get("level", "")).lower() in ERROR_LEVELS or e.get("event") == "dispatch.job_failed")
                and e.get("event") not in skip]


async def wait_until(predicate, timeout: float, what: str, *, interval: float = 0.05):
    """Poll ``predicate`` (sync) without blocking the loop; AssertionError naming ``what``."""
    end = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_for_progress(count, target: int, *, stall: float, what: str, cap: float = 900.0,
                            diagnose=lambda: "") -> float:
    """Wait until ``count()`` reaches ``target`` for as long as it keeps rising: fail only
    when it has not moved for ``stall`` seconds (stuck, not slow) or after ``cap``. The
    failure message includes ``diagnose()``. Returns the seconds waited."""
    t0 = last_move = time.monotonic()
    last = count()
    while last < target:
        await asyncio.sleep(0.2)
        now, current = time.monotonic(), count()
        if current != last:
            last, last_move = current, now
        elif now - last_move > stall or now - t0 > cap:
            raise AssertionError(f"{what}: {last}/{target} after {now - t0:.0f}s, no progress for "
                                 f"{now - last_move:.0f}s\n{diagnose()}")
    return time.monotonic() - t0



def problem_lines(stderr: str) -> list[str]:
    """The lines of a process's stderr that are not the server's JSON log lines."""
    out = []
    for line in stderr.splitlines():
        try:
            if isinstance(json.loads(line), dict):
                continue
        except ValueError:
            pass
        if line.strip():
            out.append(line)
    return out
