"""A fake Anthropic Messages API server, driven by the real ``anthropic`` SDK over loopback.

``POST /v1/messages`` answers like the real API -- JSON, or Server-Sent Events when
``"stream": true`` (``message_start``, ``content_block_start``, ``ping``,
``content_block_delta`` with ``text_delta`` / ``input_json_delta``, ``content_block_stop``,
``message_delta`` with ``stop_reason`` and ``usage``, ``message_stop``) -- and
``POST /v1/messages/count_tokens`` returns an estimate. It runs on its own thread and event
loop (see :class:`tests.fakes.fake_lark.ThreadedAiohttpServer`)::

    with FakeAnthropic() as fake:
        client = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="test", max_retries=0)
        fake.script(Text("hello"), ToolUse("memory_write", {"content": "x", "category": "knowledge"}))
        ...
        assert fake.chat_requests()[-1].json["model"] == "claude-sonnet-4-6"

Answers, in order of precedence, for each request:

1. **routes** registered with :meth:`FakeAnthropic.on_tool` (a request whose ``tool_choice``
   forces that tool -- the consolidator's calls), :meth:`on_structured` (``output_config``
   JSON-schema requests) or :meth:`on` (any predicate). Routes never consume the script, so
   chat scripts and background consolidation calls do not race.
2. the **script**: ``fake.script(*responses)`` queues answers for *chat* requests (neither a
   forced tool nor structured output), consumed in order.
3. ``fake.responder(request_json)``; the default (:func:`default_responder`) echoes
   ``"echo: <last user text>"`` (the last text block of the last user message) for chat (after a tool round: ``"echo: <tool results>"``), and for forced-tool / structured requests returns a
   minimal instance of the requested schema (so background work never crashes on shape).

A response is one of :class:`Text`, :class:`Json`, :class:`ToolUse`, :class:`Turn` (several
blocks, e.g. text + two tool uses), :class:`Error` (HTTP error, or an SSE ``error`` event
mid-stream with ``after_text``), :class:`Stall` (partial answer, then hang, then reset) and
:class:`Delay`. A plain ``str`` means ``Text``; a list means ``Turn``.

Responders run on the fake's server thread: keep them pure (no asyncio objects of the test).

Spend limit: :meth:`Error.spend_limit` answers HTTP 429 ``rate_limit_error`` with
"You have reached your specified API usage limits. You will regain access on <date> at
00:00 UTC." and ``error.details.error_code = "enforced_spend_limit_reached"``; the SDK
(anthropic 2.x) raises ``anthropic.EnforcedSpendLimitReachedError`` -- a subclass of
``RateLimitError`` whose ``.error_code`` names the cause -- and, because the answer carries
``x-should-retry: false``, does not retry it.

Token counts are a deterministic estimate (ceil(chars / 4) of tools + system + messages; see
:func:`estimate_tokens`), so a benchmark can compare prompt sizes. ``RecordedRequest.input_tokens``
is the whole prompt; the answer's ``usage`` splits it as the real API does:
``input_tokens`` (not cached) + ``cache_creation_input_tokens`` + ``cache_read_input_tokens``.

Prompt caching follows Anthropic's documented rules (build-with-claude/prompt-caching):

- the prompt is one sequence of blocks, **tools → system → messages** (each tool, each system
  block, each content block of each message is one block); a block with ``cache_control`` is a
  **breakpoint**, at most 4 per request (more is a 400);
- a cache entry is the exact prefix up to and including a breakpoint (hashed with the model);
  entries are written only at breakpoints whose prefix reaches the model's **minimum cacheable
  length** (1,024 tokens; 4,096 for Opus 4.5+ and Haiku 4.5; 2,048 for the Haiku 3 family —
  :func:`cache_min_tokens`; ``fake.cache_min_tokens`` overrides) — a shorter one caches nothing
  and is no error;
- at each breakpoint the lookup checks the breakpoint's own position, then up to **20 blocks
  before it**, for an entry; the longest prefix found anywhere is **read**
  (``cache_read_input_tokens``); every eligible breakpoint after it is **written**, and the tokens
  from the read point to the last written breakpoint are ``cache_creation_input_tokens``;
- an entry lives **5 minutes** (``"ttl": "1h"``: an hour) from its last write or read; each hit
  refreshes it. ``fake.advance(seconds)`` moves the fake's clock for tests.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import itertools
import json
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Union

from aiohttp import web

from .fake_lark import ThreadedAiohttpServer, _await_until, _wait_until

__all__ = [
    "Delay",
    "Error",
    "FakeAnthropic",
    "Json",
    "RecordedRequest",
    "Stall",
    "Text",
    "ToolUse",
    "Turn",
    "default_responder",
    "cache_min_tokens",
    "estimate_tokens",
    "forced_tool",
    "is_chat",
    "is_structured",
    "last_user_text",
    "minimal_instance",
    "schema_keys",
    "system_text",
    "tool_results",
    "user_texts",
]


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """An assistant text answer."""

    text: str
    stop_reason: str = "end_turn"  # or "max_tokens", "stop_sequence", "refusal", ...


def Json(obj: Any, stop_reason: str = "end_turn") -> Text:  # noqa: N802 - reads like a type
    """A text answer holding ``obj`` as JSON (what structured outputs return)."""
    return Text(json.dumps(obj, ensure_ascii=False), stop_reason)


@dataclass(frozen=True)
class ToolUse:
    """A ``tool_use`` block (stop_reason ``tool_use``), optionally preceded by text."""

    name: str
    input: dict
    id: str | None = None
    text_before: str = ""


@dataclass(frozen=True)
class Turn:
    """Several content blocks in one answer, e.g. ``Turn(Text("Saving."), ToolUse(...),
    ToolUse(...))``. ``stop_reason`` defaults to ``tool_use`` if any block is a tool use."""

    blocks: tuple
    stop_reason: str | None = None

    def __init__(self, *blocks: Any, stop_reason: str | None = None) -> None:
        if len(blocks) == 1 and isinstance(blocks[0], (list, tuple)):
            blocks = tuple(blocks[0])
        object.__setattr__(self, "blocks", tuple(blocks))
        object.__setattr__(self, "stop_reason", stop_reason)


@dataclass(frozen=True)
class Error:
    """An API error: HTTP ``status`` with ``{"type": "error", "error": {"type", "message"}}``.

    With ``after_text`` set and a streaming request, the stream starts normally, sends
    ``after_text`` and then an SSE ``error`` event (HTTP status stays 200; the SDK raises a
    plain ``APIStatusError`` whose ``.type`` is the error type), as Anthropic does for
    overloads mid-stream.
    """

    status: int
    type: str
    message: str
    headers: dict = field(default_factory=dict)
    error_code: str | None = None  # error.details.error_code (the SDK picks a subclass by it)
    after_text: str | None = None

    @classmethod
    def rate_limit(cls, retry_after: float | None = 1, message: str | None = None) -> "Error":
        headers = {} if retry_after is None else {"retry-after": _num(retry_after)}
        return cls(429, "rate_limit_error", message or "Number of request tokens has exceeded "
                   "your per-minute rate limit", headers)

    @classmethod
    def overloaded(cls, *, after_text: str | None = None) -> "Error":
        return cls(529, "overloaded_error", "Overloaded", after_text=after_text)

    @classmethod
    def api_error(cls, status: int = 500) -> "Error":
        return cls(status, "api_error", "Internal server error")

    @classmethod
    def invalid_request(cls, message: str) -> "Error":
        return cls(400, "invalid_request_error", message)

    @classmethod
    def spend_limit(cls, regain: _dt.date | None = None) -> "Error":
        if regain is None:
            today = _dt.date.today()
            regain = (today.replace(day=28) + _dt.timedelta(days=4)).replace(day=1)
        return cls(
            429, "rate_limit_error",
            f"You have reached your specified API usage limits. You will regain access on "
            f"{regain.isoformat()} at 00:00 UTC.",
            {"x-should-retry": "false"}, error_code="enforced_spend_limit_reached",
        )


@dataclass(frozen=True)
class Stall:
    """Send headers (and, when streaming, ``after_text`` as deltas), hang for ``seconds``,
    then reset the connection. ``Stall(seconds=0)`` resets at once (a connection error)."""

    after_text: str = ""
    seconds: float = 30.0


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` before answering with ``inner``."""

    seconds: float
    inner: Any


Response = Union[Text, ToolUse, Turn, Error, Stall, Delay, str, list]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# --------------------------------------------------------------------------------------------
# Request helpers (pure functions over the request JSON)
# --------------------------------------------------------------------------------------------


def forced_tool(req: dict) -> str | None:
    """The tool name a request forces with ``tool_choice: {"type": "tool", "name": ...}``."""
    choice = req.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool":
        return choice.get("name")
    return None


def _output_schema(req: dict) -> dict | None:
    fmt = (req.get("output_config") or {}).get("format") or req.get("output_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return fmt.get("schema") or {}
    return None


def is_structured(req: dict) -> bool:
    """True for structured-output requests (``output_config.format.type == "json_schema"``)."""
    return _output_schema(req) is not None


def is_chat(req: dict) -> bool:
    """Neither a forced tool call nor a structured-output request."""
    return forced_tool(req) is None and not is_structured(req)


def schema_keys(req: dict) -> set[str]:
    """Property names of a structured-output request's schema (to tell request kinds apart)."""
    schema = _output_schema(req) or {}
    return set((schema.get("properties") or {}).keys())


def system_text(req: dict) -> str:
    """The system prompt as one string (text blocks joined with newlines)."""
    system = req.get("system")
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(b.get("text", "") for b in system if isinstance(b, dict))
    return ""


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _message_text(msg: dict) -> str:
    return "\n".join(b.get("text", "") for b in _blocks(msg.get("content")) if b.get("type") == "text")


def user_texts(req: dict) -> list[str]:
    """The text of each user message, in order (tool-result-only messages are skipped)."""
    out = []
    for m in req.get("messages") or []:
        if m.get("role") == "user":
            text = _message_text(m)
            if text:
                out.append(text)
    return out


def last_user_text(req: dict) -> str:
    """What the user said last: the last text block of the last user message with text (a
    message may carry context blocks before the user's own words, e.g. recalled episodes)."""
    for m in reversed(req.get("messages") or []):
        if m.get("role") == "user":
            texts = [b.get("text", "") for b in _blocks(m.get("content")) if b.get("type") == "text" and b.get("text")]
            if texts:
                return texts[-1]
    return ""


def tool_results(req: dict) -> list[dict]:
    """All ``tool_result`` blocks of the last user message."""
    for m in reversed(req.get("messages") or []):
        if m.get("role") == "user":
            return [b for b in _blocks(m.get("content")) if b.get("type") == "tool_result"]
    return []


def _tool_result_text(block: dict) -> str:
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "".join(b.get("text", "") for b in c or [] if isinstance(b, dict))


def _serialise_block(b: dict) -> str:
    t = b.get("type")
    if t == "text":
        return b.get("text", "")
    if t == "tool_use":
        return b.get("name", "") + json.dumps(b.get("input", {}), ensure_ascii=False)
    if t == "tool_result":
        return _tool_result_text(b)
    return json.dumps({k: v for k, v in b.items() if k != "cache_control"}, ensure_ascii=False)


def _prompt_pieces(req: dict) -> list[tuple[str, dict | None]]:
    """(text, cache_control or None) for tools, system blocks and message blocks, in prompt order."""
    pieces: list[tuple[str, dict | None]] = []
    for tool in req.get("tools") or []:
        if isinstance(tool, dict):
            body = {k: v for k, v in tool.items() if k != "cache_control"}
            pieces.append((json.dumps(body, ensure_ascii=False), _cc(tool)))
    system = req.get("system")
    if isinstance(system, str):
        pieces.append((system, None))
    elif isinstance(system, list):
        for b in system:
            if isinstance(b, dict):
                pieces.append((b.get("text", ""), _cc(b)))
    for m in req.get("messages") or []:
        # the role is part of what is cached: the same text as user and as assistant differ
        role = str(m.get("role", ""))
        for b in _blocks(m.get("content")):
            pieces.append((role + "\x00" + _serialise_block(b), _cc(b)))
    return pieces


def _cc(block: dict) -> dict | None:
    cc = block.get("cache_control")
    return cc if isinstance(cc, dict) else None


# The documented minimum cacheable prefix per model (first match wins; default 1,024).
CACHE_MINIMUMS: list[tuple[str, int]] = [
    ("claude-opus-4-5*", 4096), ("claude-opus-4-6*", 4096), ("claude-opus-4-7*", 4096),
    ("claude-haiku-4-5*", 4096), ("claude-3-5-haiku*", 2048), ("claude-3-haiku*", 2048),
    ("claude-haiku-3*", 2048),
]
CACHE_LOOKBACK = 20           # blocks checked before each breakpoint
CACHE_TTL = {"5m": 300.0, "1h": 3600.0}


def cache_min_tokens(model: str) -> int:
    import fnmatch

    return next((n for pattern, n in CACHE_MINIMUMS if fnmatch.fnmatchcase(model or "", pattern)), 1024)


def _tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def _piece_chars(text: str) -> int:
    # message pieces carry "role\x00" for hashing; the role is not counted as prompt text
    head, sep, rest = text.partition("\x00")
    return len(rest) if sep and head in ("user", "assistant") else len(text)


def estimate_tokens(req: dict) -> int:
    """Deterministic prompt size: ceil(characters / 4) over tools + system + messages."""
    return _tokens(sum(_piece_chars(t) for t, _ in _prompt_pieces(req)))


def minimal_instance(schema: Any) -> Any:
    """The smallest value of a JSON schema (required properties only; "" / 0 / [] / False)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return minimal_instance(schema[key][0])
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ == "object" or (typ is None and "properties" in schema):
        props = schema.get("properties") or {}
        required = schema.get("required", list(props))
        return {k: minimal_instance(props.get(k, {})) for k in required}
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "null": None}.get(
        typ, None)


def existing_facts(req: dict) -> list[tuple[int, str]]:
    """The user's existing facts an ``extract_memories`` request shows the model (id, text):
    the extraction contract's input for add / reinforce / update / contradict decisions."""
    text = "\n".join(
        b.get("text", "") for m in req.get("messages") or [] if m.get("role") == "user"
        for b in _blocks(m.get("content")) if b.get("type") == "text")
    _, _, known = text.partition("Existing facts (id: text):")
    out = []
    for line in known.splitlines():
        m = re.match(r"^- #(\d+): (.*)$", line.strip())
        if m:
            out.append((int(m.group(1)), m.group(2)))
    return out


def default_responder(req: dict) -> Response:
    """Echo for chat; a minimal schema instance for forced-tool / structured requests."""
    name = forced_tool(req)
    tools = {t.get("name"): t for t in req.get("tools") or [] if isinstance(t, dict)}
    if name is not None:
        return ToolUse(name, minimal_instance((tools.get(name) or {}).get("input_schema") or {}))
    if (req.get("tool_choice") or {}).get("type") == "any" and tools:
        first = next(iter(tools.values()))
        return ToolUse(first["name"], minimal_instance(first.get("input_schema") or {}))
    schema = _output_schema(req)
    if schema is not None:
        return Json(minimal_instance(schema))
    last_user = next((m for m in reversed(req.get("messages") or []) if m.get("role") == "user"), {})
    # the user's own words: the last text block (context blocks may precede it)
    texts = [b.get("text", "") for b in _blocks(last_user.get("content")) if b.get("type") == "text" and b.get("text")]
    text = (texts[-1] if texts else "") or " ".join(_tool_result_text(b) for b in tool_results(req))
    return Text(f"echo: {text or 'ok'}")


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One Messages API request the fake received."""

    json: dict
    headers: dict[str, str]
    at: float
    path: str
    kind: str  # "chat" | "tool" | "structured"
    tool: str | None  # the forced tool name, if any
    input_tokens: int  # the estimate reported in usage (uncached + cached parts)
    answered_with: str = ""
    usage: dict = field(default_factory=dict)  # the usage the answer reported (cache split included)  # class name of the response used (Text, ToolUse, Error, ...)
    source: str = ""  # "route" | "script" | "responder" | "validation"

    @property
    def stream(self) -> bool:
        return bool(self.json.get("stream"))

    @property
    def model(self) -> str:
        return self.json.get("model", "")

    @property
    def system(self) -> str:
        return system_text(self.json)

    def header(self, name: str, default: str | None = None) -> str | None:
        lname = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lname), default)

    def __repr__(self) -> str:
        return (f"<RecordedRequest {self.kind}{'/' + self.tool if self.tool else ''} "
                f"{self.model} stream={self.stream} -> {self.answered_with}>")


# --------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


class _Invalid(Exception):
    pass


class FakeAnthropic(ThreadedAiohttpServer):
    """Fake Anthropic Messages API. See the module docstring."""

    def __init__(self, *, api_key: str | None = None) -> None:
        super().__init__()
        self.api_key = api_key  # when set, x-api-key must match
        self.responder: Callable[[dict], Response] = default_responder
        self.latency: float = 0.0  # seconds before answering each request
        self.stream_delay: float = 0.0  # seconds between SSE events
        self.stream_chunks: int = 3  # text is split into this many deltas
        self.strict: bool = True  # validate requests like the real API (400 on bad shapes)
        self.cache_min_tokens: int | None = None  # None: per model (cache_min_tokens(model))
        self.caching: bool = True  # False: cache_control is accepted and ignored (nothing cached)
        self._clock_offset = 0.0
        self.unknown_models: set[str] = set()  # GET /v1/models/{id} answers 404 for these
        self._lock = threading.RLock()
        self._script: deque = deque()
        self._routes: list[tuple[Callable[[dict], bool], Any]] = []
        self._requests: list[RecordedRequest] = []
        self._count_requests: list[RecordedRequest] = []
        self._cache: dict[str, tuple[float, float]] = {}  # prefix hash -> (expires_at, ttl)
        self._ids = itertools.count(1)

    # ---- scripting ----------------------------------------------------------------------
    def script(self, *responses: Response) -> "FakeAnthropic":
        """Queue answers for the next chat requests (consumed in order)."""
        with self._lock:
            self._script.extend(responses)
        return self

    def pending(self) -> int:
        """Script entries not yet consumed."""
        with self._lock:
            return len(self._script)

    def on(self, predicate: Callable[[dict], bool], fn: Any) -> "FakeAnthropic":
        """Answer every request matching ``predicate`` with ``fn(request)`` (or ``fn`` itself
        when it is a response object). Routes are tried in registration order."""
        with self._lock:
            self._routes.append((predicate, fn))
        return self

    def on_tool(self, name: str, fn: Any, *, keys: set[str] | None = None) -> "FakeAnthropic":
        """Answer requests forcing tool ``name``. ``fn(request)`` may return a response or a
        ``dict`` (the tool input). With ``keys`` (e.g. ``{"summary"}``), structured-output
        requests whose schema has exactly those properties are answered too (a dict becomes
        JSON text) -- the consolidator's fallback for models refusing forced tool use."""
        keys = set(keys) if keys is not None else None

        def pred(req: dict) -> bool:
            if forced_tool(req) == name:
                return True
            return keys is not None and is_structured(req) and schema_keys(req) == keys

        def answer(req: dict) -> Response:
            result = fn(req) if callable(fn) else fn
            if isinstance(result, dict):
                return Json(result) if forced_tool(req) != name else ToolUse(name, result)
            return result

        return self.on(pred, answer)

    def on_structured(self, fn: Any) -> "FakeAnthropic":
        """Answer every structured-output request; a ``dict`` result becomes JSON text."""

        def answer(req: dict) -> Response:
            result = fn(req) if callable(fn) else fn
            return Json(result) if isinstance(result, dict) else result

        return self.on(is_structured, answer)

    def clear(self) -> None:
        """Forget requests, script, routes and cache state (the responder is kept)."""
        with self._lock:
            self._script.clear()
            self._routes.clear()
            self._requests.clear()
            self._count_requests.clear()
            self._cache.clear()

    def now(self) -> float:
        """The fake's clock (monotonic, moved by :meth:`advance`): cache entries expire on it."""
        return time.monotonic() + self._clock_offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock forward, e.g. past the 5-minute cache TTL."""
        with self._lock:
            self._clock_offset += seconds

    # ---- inspection ---------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """Every ``/v1/messages`` request, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def count_tokens_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._count_requests)

    def chat_requests(self) -> list[RecordedRequest]:
        """Requests that are neither forced-tool nor structured (i.e. not consolidation)."""
        return [r for r in self.requests if r.kind == "chat"]

    def tool_requests(self, name: str | None = None) -> list[RecordedRequest]:
        return [r for r in self.requests if r.kind == "tool" and (name is None or r.tool == name)]

    def structured_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.kind == "structured"]

    def last_system_text(self, req: RecordedRequest | dict | None = None) -> str:
        """System prompt of ``req`` (default: the last chat request) as one string."""
        if req is None:
            chats = self.chat_requests()
            if not chats:
                raise AssertionError("no chat request recorded")
            req = chats[-1]
        return system_text(req.json if isinstance(req, RecordedRequest) else req)

    @staticmethod
    def user_texts(req: RecordedRequest | dict) -> list[str]:
        return user_texts(req.json if isinstance(req, RecordedRequest) else req)

    @staticmethod
    def last_user_text(req: RecordedRequest | dict) -> str:
        """What the user said last (the context blocks in front of it left out)."""
        return last_user_text(req.json if isinstance(req, RecordedRequest) else req)

    def wait_for_requests(self, n: int, timeout: float = 5.0, *, kind: str | None = None) -> list[RecordedRequest]:
        """Block until ``n`` requests (of ``kind``) arrived. Not from a running loop."""
        return _wait_until(lambda: self._enough(n, kind), timeout,
                           lambda: self._dump(n, kind, timeout), "wait_for_requests")

    async def wait_for_requests_async(self, n: int, timeout: float = 5.0, *, kind: str | None = None) -> list[RecordedRequest]:
        return await _await_until(lambda: self._enough(n, kind), timeout,
                                  lambda: self._dump(n, kind, timeout))

    def _enough(self, n: int, kind: str | None):
        reqs = [r for r in self.requests if kind is None or r.kind == kind]
        return reqs if len(reqs) >= n else None

    def _dump(self, n: int, kind: str | None, timeout: float) -> str:
        lines = [f"FakeAnthropic: expected {n} {kind or ''} request(s) within {timeout}s; got:"]
        lines += [f"  {r!r} last user: {last_user_text(r.json)[:100]!r}" for r in self.requests] or ["  (none)"]
        lines.append(f"Script entries left: {self.pending()}")
        if self.internal_errors:
            lines.append("Fake internal errors:\n" + "\n".join(self.internal_errors))
        return "\n".join(lines)

    # ---- server -------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._h_messages)
        app.router.add_post("/v1/messages/count_tokens", self._h_count_tokens)
        app.router.add_get("/v1/models/{model_id}", self._h_model)
        app.router.add_route("*", "/{tail:.*}", self._h_unknown)
        return app

    def _request_id(self) -> str:
        return f"req_fake_{next(self._ids)}"

    def _error_response(self, err: Error) -> web.Response:
        error: dict[str, Any] = {"type": err.type, "message": err.message}
        if err.error_code:
            error["details"] = {"error_code": err.error_code}
        rid = self._request_id()
        return web.Response(
            status=err.status, content_type="application/json",
            body=json.dumps({"type": "error", "error": error, "request_id": rid}).encode(),
            headers={"request-id": rid, **err.headers},
        )

    def _auth_error(self, request: web.Request) -> Error | None:
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization", "")
        if not key and not bearer:
            return Error(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key and bearer != f"Bearer {self.api_key}":
            return Error(401, "authentication_error", "invalid x-api-key")
        if self.strict and not request.headers.get("anthropic-version"):
            return Error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    async def _h_model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (the bot's start-up check): 404 for ids in ``unknown_models``."""
        err = self._auth_error(request)
        if err is not None:
            return self._error_response(err)
        model_id = request.match_info["model_id"]
        if model_id in self.unknown_models:
            return self._error_response(Error(404, "not_found_error", f"model: {model_id}"))
        return web.json_response({"type": "model", "id": model_id, "display_name": model_id,
                                  "created_at": "2026-01-01T00:00:00Z"})

    async def _h_unknown(self, request: web.Request) -> web.Response:
        return self._error_response(Error(404, "not_found_error",
                                          f"Not found: {request.method} {request.path} (fake anthropic)"))

    async def _read_json(self, request: web.Request) -> dict | Error:
        try:
            body = await request.json()
        except ValueError:
            return Error.invalid_request("Request body is not valid JSON")
        if not isinstance(body, dict):
            return Error.invalid_request("Request body must be a JSON object")
        return body

    async def _h_count_tokens(self, request: web.Request) -> web.Response:
        err = self._auth_error(request)
        body = await self._read_json(request)
        if err is None and isinstance(body, Error):
            err = body
        if err is not None:
            return self._error_response(err)
        n = estimate_tokens(body)
        with self._lock:
            self._count_requests.append(RecordedRequest(
                json=body, headers=dict(request.headers), at=time.time(), path=request.path,
                kind="count_tokens", tool=None, input_tokens=n, answered_with="count", source="count"))
        return web.json_response({"input_tokens": n})

    async def _h_messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if isinstance(body, Error):
            return self._error_response(body)
        rec = RecordedRequest(
            json=body, headers=dict(request.headers), at=time.time(), path=request.path,
            kind="chat" if is_chat(body) else ("tool" if forced_tool(body) else "structured"),
            tool=forced_tool(body), input_tokens=estimate_tokens(body),
        )
        with self._lock:
            self._requests.append(rec)

        if self.latency > 0 and await self._park(self.latency):
            return web.Response(status=503)

        problem = self._auth_error(request)
        if problem is None and self.strict:
            try:
                self._validate(body)
            except _Invalid as exc:
                problem = Error.invalid_request(str(exc))
        if problem is not None:
            rec.answered_with, rec.source = "Error", "validation"
            return self._error_response(problem)

        try:
            response, source = self._choose(body, rec.kind)
        except Exception:
            import traceback

            with self._lock:
                self.internal_errors.append(traceback.format_exc())
            response, source = Error.api_error(), "responder-crash"
        rec.source = source

        while True:
            if isinstance(response, Delay):
                if await self._park(response.seconds):
                    return web.Response(status=503)
                response = response.inner
                continue
            if callable(response) and not isinstance(response, (Text, ToolUse, Turn, Error, Stall)):
                response = response(body)
                continue
            break
        rec.answered_with = type(response).__name__
        return await self._answer(request, body, response, rec)

    def _choose(self, body: dict, kind: str) -> tuple[Any, str]:
        with self._lock:
            routes = list(self._routes)
        for predicate, fn in routes:
            if predicate(body):
                return (fn(body) if callable(fn) else fn), "route"
        if kind == "chat":
            with self._lock:
                if self._script:
                    return self._script.popleft(), "script"
        return self.responder(body), "responder"

    # ---- validation (the real API's 400s that catch tool-loop and prompt bugs) ----------
    def _validate(self, req: dict) -> None:
        for fld in ("model", "max_tokens", "messages"):
            if fld not in req:
                raise _Invalid(f"{fld}: Field required")
        if not isinstance(req["max_tokens"], int) or req["max_tokens"] < 1:
            raise _Invalid("max_tokens: Input should be greater than or equal to 1")
        messages = req["messages"]
        if not isinstance(messages, list) or not messages:
            raise _Invalid("messages: at least one message is required")
        tools = req.get("tools") or []
        names = set()
        for i, tool in enumerate(tools):
            name = tool.get("name", "") if isinstance(tool, dict) else ""
            if "type" not in tool or tool.get("type") == "custom":
                if not _TOOL_NAME.match(name):
                    raise _Invalid(f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
                if "input_schema" not in tool:
                    raise _Invalid(f"tools.{i}.custom.input_schema: Field required")
            if name in names:
                raise _Invalid("tools: Tool names must be unique.")
            names.add(name)
        choice = req.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("tool", "any") and not tools:
            raise _Invalid("tool_choice may only be specified while providing tools.")
        if forced_tool(req) is not None and forced_tool(req) not in names:
            raise _Invalid(f"tool_choice: tool '{forced_tool(req)}' was not found in tools")
        system = req.get("system")
        for i, b in enumerate(system if isinstance(system, list) else []):
            if isinstance(b, dict) and "cache" in b:
                raise _Invalid(f"system.{i}.cache: Extra inputs are not permitted")
        for i, m in enumerate(req.get("messages") or []):
            for j, b in enumerate(_blocks(m.get("content")) if isinstance(m, dict) else []):
                if "cache" in b:
                    raise _Invalid(f"messages.{i}.content.{j}.{b.get('type')}.cache: Extra inputs are not permitted")
        breakpoints = sum(1 for _, cc in _prompt_pieces(req) if cc)
        if breakpoints > 4:
            raise _Invalid(f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}.")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
                raise _Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            content = m.get("content")
            if isinstance(content, str):
                if not content and not (m["role"] == "assistant" and i == len(messages) - 1):
                    raise _Invalid(f"messages.{i}: all messages must have non-empty content except "
                                   f"for the optional final assistant message")
                continue
            if not isinstance(content, list):
                raise _Invalid(f"messages.{i}.content: Input should be a valid list")
            if not content and not (m["role"] == "assistant" and i == len(messages) - 1):
                raise _Invalid(f"messages.{i}: all messages must have non-empty content except "
                               f"for the optional final assistant message")
            for j, b in enumerate(content):
                if not isinstance(b, dict) or "type" not in b:
                    raise _Invalid(f"messages.{i}.content.{j}: Input should be a valid content block")
                if b["type"] == "text" and not (b.get("text") or "").strip():
                    raise _Invalid("messages: text content blocks must contain non-whitespace text"
                                   if b.get("text") else "messages: text content blocks must be non-empty")
                if b["type"] == "tool_result":
                    prev = messages[i - 1] if i > 0 else {}
                    prev_ids = {x.get("id") for x in _blocks(prev.get("content"))
                                if x.get("type") == "tool_use"} if prev.get("role") == "assistant" else set()
                    if b.get("tool_use_id") not in prev_ids:
                        raise _Invalid(
                            f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                            f"blocks: {b.get('tool_use_id')}. Each `tool_result` block must have a "
                            f"corresponding `tool_use` block in the previous message.")
            if m["role"] == "assistant":
                ids = [x.get("id") for x in content if isinstance(x, dict) and x.get("type") == "tool_use"]
                if ids and i + 1 < len(messages):
                    nxt = messages[i + 1]
                    got = {x.get("tool_use_id") for x in _blocks(nxt.get("content"))
                           if x.get("type") == "tool_result"} if nxt.get("role") == "user" else set()
                    missing = [x for x in ids if x not in got]
                    if missing:
                        raise _Invalid(
                            f"messages.{i + 1}: `tool_use` ids were found without `tool_result` "
                            f"blocks immediately after: {', '.join(missing)}. Each `tool_use` block "
                            f"must have a corresponding `tool_result` block in the next message.")

    # ---- answering ----------------------------------------------------------------------
    def _usage(self, req: dict, output_tokens: int) -> dict:
        """The usage block, prompt caching simulated by the documented rules (module docstring)."""
        pieces = _prompt_pieces(req)
        model = str(req.get("model", ""))
        chars = 0
        cum: list[int] = []          # tokens of the prefix up to and including block i
        keys: list[str] = []
        h = hashlib.sha256(("model\x00" + model).encode())
        for text, _ in pieces:
            chars += _piece_chars(text)
            cum.append(_tokens(chars))
            h.update(b"\x01" + text.encode())
            keys.append(h.copy().hexdigest())
        total = _tokens(chars)
        breakpoints = [i for i, (_, cc) in enumerate(pieces) if cc]
        minimum = self.cache_min_tokens if self.cache_min_tokens is not None else cache_min_tokens(model)
        read_at = written_to = -1
        if self.caching and breakpoints:
            with self._lock:
                now = self.now()
                for k in [k for k, (exp, _) in self._cache.items() if exp <= now]:
                    del self._cache[k]
                for b in breakpoints:
                    for j in range(b, max(-1, b - CACHE_LOOKBACK - 1), -1):
                        if keys[j] in self._cache:
                            read_at = max(read_at, j)
                            break
                if read_at >= 0:
                    _, ttl = self._cache[keys[read_at]]
                    if pieces[read_at][1]:      # asked again at the same breakpoint: the longer TTL
                        ttl = max(ttl, CACHE_TTL.get(str(pieces[read_at][1].get("ttl", "5m")), ttl))
                    self._cache[keys[read_at]] = (now + ttl, ttl)
                for b in breakpoints:
                    if b > read_at and cum[b] >= minimum:
                        ttl = CACHE_TTL.get(str(pieces[b][1].get("ttl", "5m")), CACHE_TTL["5m"])
                        self._cache[keys[b]] = (now + ttl, ttl)
                        written_to = b
        read = cum[read_at] if read_at >= 0 else 0
        created = cum[written_to] - read if written_to > read_at else 0
        return {
            "input_tokens": total - created - read,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def _content(self, response: Any) -> tuple[list[dict], str]:
        """Normalise a response into (content blocks, stop_reason)."""
        if isinstance(response, str):
            response = Text(response)
        if isinstance(response, list):
            response = Turn(*response)
        if isinstance(response, Text):
            return [{"type": "text", "text": response.text}], response.stop_reason
        if isinstance(response, ToolUse):
            response = Turn(response)  # its text_before is emitted by the Turn loop
        if isinstance(response, Turn):
            blocks: list[dict] = []
            has_tool = False
            for item in response.blocks:
                if isinstance(item, str):
                    item = Text(item)
                if isinstance(item, Text):
                    blocks.append({"type": "text", "text": item.text})
                elif isinstance(item, ToolUse):
                    has_tool = True
                    if item.text_before:
                        blocks.append({"type": "text", "text": item.text_before})
                    blocks.append({"type": "tool_use", "id": item.id or f"toolu_fake_{next(self._ids)}",
                                   "name": item.name, "input": copy.deepcopy(item.input)})
                else:
                    raise TypeError(f"Turn blocks must be Text/ToolUse/str, got {item!r}")
            return blocks, response.stop_reason or ("tool_use" if has_tool else "end_turn")
        raise TypeError(f"not a FakeAnthropic response: {response!r}")

    @staticmethod
    def _output_tokens(blocks: list[dict]) -> int:
        chars = sum(len(b.get("text", "")) if b["type"] == "text"
                    else len(json.dumps(b.get("input", {}), ensure_ascii=False)) for b in blocks)
        return max(1, _tokens(chars))

    async def _answer(self, request: web.Request, req: dict, response: Any,
                      rec: RecordedRequest) -> web.StreamResponse:
        stream = bool(req.get("stream"))
        if isinstance(response, Error) and (response.after_text is None or not stream):
            return self._error_response(response)
        if isinstance(response, Stall) and (not stream or (response.seconds <= 0 and not response.after_text)):
            await self._park(response.seconds)
            self._drop_connection(request)
            return web.Response(status=503)
        if isinstance(response, (Error, Stall)):
            blocks, stop = [{"type": "text", "text": response.after_text or ""}], None
        else:
            blocks, stop = self._content(response)
        usage = self._usage(req, self._output_tokens(blocks))
        rec.usage = usage
        msg_id = f"msg_fake_{next(self._ids)}"
        message = {"id": msg_id, "type": "message", "role": "assistant", "model": req.get("model"),
                   "content": blocks, "stop_reason": stop, "stop_sequence": None,
                   "stop_details": None, "container": None, "usage": usage}
        if not stream:
            return web.Response(
                content_type="application/json", headers={"request-id": self._request_id()},
                body=json.dumps(message, ensure_ascii=False).encode())
        return await self._sse(request, message, response)

    def _split(self, s: str) -> list[str]:
        if not s:
            return []
        n = max(1, min(self.stream_chunks, len(s)))
        size = math.ceil(len(s) / n)
        return [s[i:i + size] for i in range(0, len(s), size)]

    async def _sse(self, request: web.Request, message: dict, response: Any) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
            "request-id": self._request_id()})
        await resp.prepare(request)

        async def send(event: str, data: dict) -> None:
            await resp.write(f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode())
            if self.stream_delay > 0:
                await self._park(self.stream_delay)

        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**usage, "output_tokens": 1}}
        try:
            await send("message_start", {"type": "message_start", "message": start})
            for index, block in enumerate(message["content"]):
                if block["type"] == "text":
                    await send("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}})
                    if index == 0:
                        await send("ping", {"type": "ping"})
                    for piece in self._split(block["text"]):
                        await send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": {"type": "text_delta", "text": piece}})
                else:
                    await send("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {**block, "input": {}}})
                    if index == 0:
                        await send("ping", {"type": "ping"})
                    raw = json.dumps(block["input"], ensure_ascii=False)
                    for piece in self._split(raw) or [""]:
                        await send("content_block_delta", {
                            "type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece}})
                if isinstance(response, Stall):
                    await self._park(response.seconds)
                    self._drop_connection(request)
                    return resp
                if isinstance(response, Error):
                    await send("error", {"type": "error", "error": {
                        "type": response.type, "message": response.message}})
                    await resp.write_eof()
                    return resp
                await send("content_block_stop", {"type": "content_block_stop", "index": index})
            await send("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None, "stop_details": None},
                "usage": {k: v for k, v in usage.items() if k != "service_tier"}})
            await send("message_stop", {"type": "message_stop"})
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away mid-stream (e.g. it timed out); nothing to do
        return resp


@contextlib.contextmanager
def running_model(responder: Callable[[dict], Response] | None = None) -> Iterator["FakeAnthropic"]:
    """A started FakeAnthropic whose consolidation calls get valid empty answers, so background
    work never fails on its own; ``responder`` answers the chat turns. Stopped afterwards."""
    fake = FakeAnthropic().start()
    fake.on_tool("write_summary", lambda req: {"summary": "(summary)"}, keys={"summary"})
    fake.on_tool("extract_memories", lambda req: {"facts": [], "profile_psych": []},
                 keys={"facts", "profile_psych"})
    if responder is not None:
        fake.responder = responder
    try:
        yield fake
    finally:
        fake.stop()
