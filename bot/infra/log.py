"""Structured logging: JSON lines when not on a TTY, readable console otherwise.

Every line about an event carries chat_id and the event/message id (bound by the
caller). A processor scrubs anything that looks like a secret, so a token that
slips into a log call never reaches the output.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import threading

import structlog

_SECRET_KEYS = re.compile(r"(secret|token|password|api_key|encrypt_key|authorization)", re.I)
_SECRET_VALUES = re.compile(r"(sk-ant-[\w-]{6,}|sk-[\w-]{16,}|t-[0-9a-f]{32,}|Bearer\s+\S+)")


_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s'\"<>]+)")


def safe_url(url: str) -> str:
    """``url`` without its userinfo and query (``https://u:p@h/x?api-key=k`` →
    ``https://[redacted]@h/x?[redacted]``): model base URLs and database URLs carry credentials."""
    return redact_urls(url)


def redact_urls(text: str) -> str:
    """Every URL in ``text`` with its userinfo and query string replaced by ``[redacted]``."""
    def one(m: re.Match) -> str:
        rest = m.group(2)
        rest, hash_, frag = rest.partition("#")
        rest, q, query = rest.partition("?")
        netloc, slash, path = rest.partition("/")
        if "@" in netloc:
            netloc = "[redacted]@" + netloc.rpartition("@")[2]
        out = m.group(1) + netloc + slash + path
        if q:
            out += "?[redacted]"
        return out + (hash_ + frag if hash_ and not q else "")
    return _URL.sub(one, text) if "://" in text else text


def _scrub(_, __, event_dict: dict) -> dict:
    for k, v in list(event_dict.items()):
        # A number is never a secret: token *counts* (input_tokens, …) stay readable.
        if _SECRET_KEYS.search(k) and k != "event" and v not in (None, "", False) \
                and not isinstance(v, (int, float)):
            event_dict[k] = "[redacted]"
        elif isinstance(v, str):
            event_dict[k] = redact_urls(_SECRET_VALUES.sub("[redacted]", v))
    return event_dict


class _Stderr:
    """A stream that always writes to the current ``sys.stderr``, a whole line at a time, and
    never raises.

    structlog's print() writes a line and its newline in two calls, under its own lock; a
    library logging from a thread (psycopg's pool while PostgreSQL is down) writes through the
    stdlib handler, under another. Between the two calls the other line landed, and two JSON
    lines became one unreadable line. So text is kept per thread until its newline, and each
    complete line goes out in one write under one lock.

    A log line is never worth a request: ``make run 2>&1 | tee log`` and the reader gone, every
    write raised BrokenPipeError into the code that logged (each ``POST /chat`` a 500, the
    signal handler's first line, the forced exit's own line — so SIGTERM ended nothing). A
    stream that failed once is given up: its lines are dropped and counted
    (``dropped_lines``, the ``ethan_log_lines_dropped_total`` metric), and its descriptor
    now points at /dev/null so no other writer (a library's print, the interpreter's flush at
    exit) trips on it either."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending = threading.local()
        self._broken: object = None     # the sys.stderr object that failed, while it is current
        self.dropped = 0

    def _emit(self, text: str) -> None:
        with self._lock:
            stream = sys.stderr
            if stream is not None and stream is not self._broken:
                try:
                    stream.write(text)
                    return
                except (OSError, ValueError) as e:
                    self._give_up(stream, e)
            self.dropped += text.count("\n") or 1

    def _give_up(self, stream, error: Exception) -> None:
        """A reader gone (EPIPE) or a closed stream never comes back: give it up. Anything
        else (a full disk, a full non-blocking pipe) may pass: only this line is lost."""
        if isinstance(error, (BrokenPipeError, ValueError)) or getattr(error, "errno", None) == errno.EBADF:
            self._broken = stream
            _to_devnull(stream)

    def write(self, text: str) -> int:
        buffered = getattr(self._pending, "text", "") + text
        head, sep, rest = buffered.rpartition("\n")
        self._pending.text = rest
        if sep:
            self._emit(head + sep)
        return len(text)

    def flush(self) -> None:
        rest = getattr(self._pending, "text", "")
        if rest:
            self._pending.text = ""
            self._emit(rest)
        with self._lock:
            stream = sys.stderr
            if stream is None or stream is self._broken:
                return
            try:
                stream.flush()
            except (OSError, ValueError) as e:
                self._give_up(stream, e)

    def isatty(self) -> bool:
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False


def _to_devnull(stream) -> None:
    """Point a broken stream's descriptor (and stdout's, when it is the same pipe) at /dev/null:
    what is still in its buffer, and whatever else writes there, then goes nowhere instead of
    raising — at exit too, where a failed flush of a dead pipe made the exit status 120."""
    try:
        fd = stream.fileno()
        dead = os.fstat(fd)
    except (OSError, ValueError, AttributeError):
        return      # a closed file, or no descriptor at all: there is nothing to redirect
    targets = [fd]
    for other in (sys.stdout, sys.__stdout__, sys.__stderr__):
        try:
            ofd = other.fileno()
            st = os.fstat(ofd)
        except (OSError, ValueError, AttributeError):
            continue
        if (st.st_dev, st.st_ino) == (dead.st_dev, dead.st_ino) and ofd not in targets:
            targets.append(ofd)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for target in targets:
            os.dup2(null, target)
    finally:
        os.close(null)


_STDERR = _Stderr()      # one per process: its count of dropped lines survives reconfiguration


def dropped_lines() -> int:
    """Log lines dropped because stderr could not take them (a closed or broken pipe)."""
    return _STDERR.dropped


def _stdlib_formatter(json: bool) -> logging.Formatter:
    """What a stdlib record (a library's, or memory/'s: it logs through stdlib logging since it
    must not import bot/) becomes: the same JSON line as Ethan's own, with ``logger`` (its name)
    and any ``extra=`` fields — never a raw line a log shipper or the tests' "no raw lines"
    check would take for unstructured output. The traceback, if any, is a field of the line
    and is scrubbed like the rest (psycopg's errors name hosts and URLs)."""
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.stdlib.ExtraAdder(),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,     # a text field before _scrub, on a terminal too
            _scrub,
            structlog.processors.JSONRenderer(ensure_ascii=False) if json else structlog.dev.ConsoleRenderer(),
        ])


def adopt_library_handlers(*names: str) -> None:
    """Take away the stream handlers a library installed on its own loggers (lark-oapi prints
    ``[Lark] [time] [WARNING] …`` to stdout): their records go on to the root handler, which
    writes them as JSON (and once, not twice)."""
    for name in names:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler and handler.stream in (sys.stdout, sys.stderr):
                logger.removeHandler(handler)


LIBRARY_LOGGERS = ("Lark",)     # loggers a library gives a handler of its own (see adopt_library_handlers)


def configure_logging(level: str = "info", *, json: bool | None = None, stream=None) -> None:
    # Without a stream, write to whatever sys.stderr is at the time of each line, not the object
    # it was at configuration (a redirected stderr that was later closed broke every log call).
    stream = stream or _STDERR
    if json is None:
        json = not stream.isatty()
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _scrub,
        structlog.processors.format_exc_info if json else structlog.dev.set_exc_info,
        structlog.processors.JSONRenderer(ensure_ascii=False) if json else structlog.dev.ConsoleRenderer(),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries log through stdlib logging; keep them quiet unless something is wrong.
    logging.basicConfig(level=logging.WARNING, stream=stream)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            handler.setFormatter(_stdlib_formatter(json))
    adopt_library_handlers(*LIBRARY_LOGGERS)
    for noisy in ("Lark", "httpx", "anthropic", "openai", "jieba", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str = "ethan"):
    return structlog.get_logger(name)
