"""Shared benchmark plumbing: machine description, percentiles, Markdown tables, the
server in a subprocess (``python -m bot serve``) against the wire fakes, and a load
generator that posts real signed, encrypted webhook requests over loopback.

The fakes (``tests/fakes``) run on their own threads in the benchmark process; the
server runs in its own process, so its CPU time (``/proc/<pid>/stat``) and resident
memory (``/proc/<pid>/status``) are measured apart from the fakes and the load generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import logging  # noqa: E402

import structlog  # noqa: E402

from tests.fakes.fake_anthropic import FakeAnthropic  # noqa: E402
from tests.fakes.fake_lark import FakeLark  # noqa: E402
from tests.fakes.lark_events import make_text_event, webhook_request  # noqa: E402

# The benchmark process logs nothing below errors (the server subprocess logs to a file).
# Not when a test imports a bench part: a filtering logger set here would hide every later
# test's log lines from structlog.testing.capture_logs (test_outbound's retries counted 0).
if "pytest" not in sys.modules:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.getLogger("Lark").setLevel(logging.ERROR)
    logging.getLogger("ethan").setLevel(logging.ERROR)        # in-process app parts (consolidation queue)
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)   # fakes answering a server that left

ENCRYPT_KEY = "bench-encrypt-key"
VERIFICATION_TOKEN = "bench-vtoken"
APP_ID = "cli_bench"
APP_SECRET = "bench-secret"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- machine -----------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def machine_lines() -> list[str]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return [
        f"- date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- CPU: {cpu_model()}, {cores} cores available",
        f"- RAM: {ram_gib():.1f} GiB",
        f"- OS: {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"SQLite {sqlite3.sqlite_version}",
        f"- load average at the start: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min; "
        f"other work on the machine shares its cores)",
    ]


# ---- statistics / formatting -------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ms(seconds: float, digits: int = 1) -> str:
    if seconds != seconds:  # nan
        return "—"
    v = seconds * 1000
    if digits == 1 and v >= 100:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    """a / b as '12.3×' (one decimal below 100)."""
    if not b or a != a or b != b:
        return "—"
    r = a / b
    if r >= 100:
        return f"{r:,.0f}×"
    if r >= 0.95:
        return f"{r:.1f}×"
    return f"{r:.2g}×"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A Markdown table. ``align``: one char per column, 'l' or 'r' (default: first l, rest r)."""
    align = align or ("l" + "r" * (len(header) - 1))
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return out


# ---- temp homes, ports ---------------------------------------------------------------------

@contextlib.contextmanager
def temp_home(prefix: str = "ethan-bench-"):
    """A temporary ETHAN_HOME directory, removed afterwards. It is passed explicitly (the
    server's environment, ``Database(path)``), never through ``os.environ``, so benchmarks
    may run side by side in threads."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        yield Path(d)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- fakes --------------------------------------------------------------------------------

class BenchLark(FakeLark):
    """FakeLark that also timestamps each delivered reply by the message it answers, so a
    load generator can wait for "the reply to X" in O(1) instead of scanning every message.
    Reaction removal is indexed (the base class scans every reaction ever added)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(app_id=APP_ID, app_secret=APP_SECRET, **kw)
        self.replied_at: dict[str, float] = {}       # inbound message_id -> monotonic time
        self.delivered = 0
        self._cond = threading.Condition()
        self._reaction_index: dict[str, dict] = {}
        self.keep_calls = True

    def _deliver(self, *, kind, body, chat_id, receive_id=None, receive_id_type=None, parent=None):
        result = super()._deliver(kind=kind, body=body, chat_id=chat_id, receive_id=receive_id,
                                  receive_id_type=receive_id_type, parent=parent)
        if parent is not None and body.get("msg_type") != "interactive":
            now = time.monotonic()
            with self._cond:
                if parent.message_id not in self.replied_at:
                    self.replied_at[parent.message_id] = now
                    self.delivered += 1
                self._cond.notify_all()
        if not self.keep_calls:
            with self._lock:
                self._calls.clear()
        return result

    def _h_react(self, call, body, mid):
        status, payload, headers = super()._h_react(call, body, mid)
        with self._lock:
            rec = self._reactions[-1]
            self._reaction_index[rec["reaction_id"]] = rec
        return status, payload, headers

    def _h_unreact(self, call, body, mid, rid):
        from tests.fakes.fake_lark import _Reject

        with self._lock:
            rec = self._reaction_index.get(rid)
            if rec is None or rec["message_id"] != mid or rec["deleted"]:
                raise _Reject(231003, "The reaction does not exist.")
            rec["deleted"] = True
        return self._ok(self._reaction_data(rec))

    def wait_delivered(self, n: int, timeout: float) -> int:
        """Block until ``n`` replies arrived (or timeout); returns how many did."""
        end = time.monotonic() + timeout
        with self._cond:
            while self.delivered < n:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            return self.delivered


class Fakes:
    """FakeLark + FakeAnthropic on their own threads (context manager)."""

    def __init__(self, *, model_latency: float = 0.0) -> None:
        self.lark = BenchLark()
        self.model = FakeAnthropic()
        self.model.latency = model_latency

    def __enter__(self) -> "Fakes":
        self.lark.start()
        self.model.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.model.stop()
        self.lark.stop()


# ---- the server in a subprocess ------------------------------------------------------------

def server_env(home: Path, fakes: Fakes, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LARK_", "ANTHROPIC_", "OPENAI_", "ETHAN_"))}
    env.update({
        "LARK_APP_ID": APP_ID,
        "LARK_APP_SECRET": APP_SECRET,
        "LARK_DOMAIN": fakes.lark.base_url,
        "LARK_TRANSPORT": "webhook",
        "LARK_ENCRYPT_KEY": ENCRYPT_KEY,
        "LARK_VERIFICATION_TOKEN": VERIFICATION_TOKEN,
        "ANTHROPIC_API_KEY": "bench-key",
        "ANTHROPIC_BASE_URL": fakes.model.base_url,
        "ETHAN_HOME": str(home),
        "ETHAN_HOST": "127.0.0.1",
        "ETHAN_PORT": str(port),
        "ETHAN_SHUTDOWN_DEADLINE": "2",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    env.update({k.upper(): str(v) for k, v in extra.items()})
    return env


# `python -m bot serve` with cProfile switched on by SIGUSR1 and off (stats written) by
# SIGUSR2, so the profile covers the load and not start-up (imports) or shutdown.
PROFILED_SERVE = """
import cProfile, os, signal, sys
out = sys.argv[1]
prof = cProfile.Profile()
def _on(*_):
    prof.enable()
def _off(*_):
    prof.disable()
    tmp = out + ".tmp"
    prof.dump_stats(tmp)
    os.replace(tmp, out)
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
from bot.infra.cli import main
sys.exit(main(["serve"]))
"""


class Server:
    """``python -m bot serve`` in a subprocess; ``profile`` = path for cProfile stats."""

    def __init__(self, home: Path, fakes: Fakes, *, profile: Path | None = None, **env: str) -> None:
        self.home = home
        self.port = free_port()
        self.env = server_env(home, fakes, self.port, **env)
        self.profile = profile
        self.proc: subprocess.Popen | None = None
        self.log_path = home / "server.log"
        self.cwd = home
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        if self.profile is not None:
            return [sys.executable, "-c", PROFILED_SERVE, str(self.profile)]
        return [sys.executable, "-m", "bot", "serve"]

    def launch(self) -> "Server":
        """Start the process without waiting (several servers can start at once)."""
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), env=self.env, cwd=str(self.cwd), stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def start(self, timeout: float = 60.0) -> "Server":
        if self.proc is None:
            self.launch()
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        import urllib.request

        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server not healthy within {timeout}s:\n{self.tail()}")

    def _logged(self, event: str) -> bool:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                return f'"event": "{event}"'.encode() in f.read()
        except OSError:
            return False

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the server's ``/metrics`` (0 when it has none such)."""
        import urllib.request
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(want + " "):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process (all its threads)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def thread_cpu(self) -> dict[int, float]:
        """CPU seconds per thread (tid -> s); the event loop's thread has tid == pid."""
        out: dict[int, float] = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        return out

    def loop_cpu_seconds(self) -> float:
        """CPU of the main thread (the asyncio event loop)."""
        return self.thread_cpu().get(self.pid, 0.0)

    def profile_on(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    def profile_off(self) -> None:
        """Stop profiling; the stats file is written when this returns."""
        self.proc.send_signal(signal.SIGUSR2)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.profile is not None and self.profile.exists() and self.profile.stat().st_size > 0:
                time.sleep(0.2)
                return
            time.sleep(0.05)

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the app stops in order); once it has logged ``app.stopped`` the interpreter's
        own teardown (a second or so for lark-oapi's module graph) is not waited for."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            end = time.monotonic() + timeout
            stopped_at = None
            while self.proc.poll() is None and time.monotonic() < end:
                if stopped_at is None and self._logged("app.stopped"):
                    stopped_at = time.monotonic()
                if stopped_at is not None and time.monotonic() - stopped_at > 0.3:
                    break
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- load generation -----------------------------------------------------------------------

def signed_request(text: str, *, chat_id: str, sender: str, chat_type: str = "p2p",
                   **kw: Any) -> tuple[str, dict[str, str], bytes]:
    """(message_id, headers, body) of one encrypted, signed ``im.message.receive_v1`` POST."""
    if chat_type != "p2p":
        kw.setdefault("mentions", ["ou_bot"])
    event = make_text_event(text, chat_id=chat_id, chat_type=chat_type, sender=sender,
                            app_id=APP_ID, token=VERIFICATION_TOKEN, **kw)
    headers, body = webhook_request(event, encrypt_key=ENCRYPT_KEY, verification_token=VERIFICATION_TOKEN)
    return event["event"]["message"]["message_id"], headers, body


async def post_all(url: str, requests: Sequence[tuple[str, dict, bytes]], concurrency: int,
                   *, sent_at: dict[str, float] | None = None) -> tuple[list[float], list[int]]:
    """POST every request with at most ``concurrency`` in flight (closed loop: each connection
    sends its next request when the previous one is answered), from the load-generator process
    (``bench/loadgen.py``); returns (seconds per request, HTTP statuses). ``sent_at`` receives
    each message's send time (``time.monotonic``, the same clock in every process)."""
    return await _loadgen(url, requests, concurrency, None, sent_at)


async def post_at_rate(url: str, requests: Sequence[tuple[str, dict, bytes]], rate: float,
                       ) -> tuple[list[float], list[int]]:
    """Open loop: request i is sent at start + i / rate whether or not earlier ones were
    answered (as Lark does); returns (seconds per request, HTTP statuses)."""
    return await _loadgen(url, requests, 0, rate, None)


async def _loadgen(url: str, requests: Sequence[tuple[str, dict, bytes]], concurrency: int,
                   rate: float | None, sent_at: dict[str, float] | None) -> tuple[list[float], list[int]]:
    import pickle

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.loadgen", cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(pickle.dumps((url, list(requests), concurrency, rate)))
    if proc.returncode != 0:
        raise RuntimeError(f"load generator exited with {proc.returncode}")
    result = json.loads(out)
    if sent_at is not None:
        for (mid, _, _), t in zip(requests, result["sent"]):
            sent_at[mid] = t
    return result["lat"], result["status"]


def run_async(coro):
    return asyncio.run(coro)


def header(title: str, lines: Sequence[str]) -> list[str]:
    return [f"### {title}", "", *lines, ""]
