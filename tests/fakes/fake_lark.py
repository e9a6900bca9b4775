"""A fake Lark/Feishu Open API server, for tests that drive the real SDKs over loopback.

The server speaks the Open API's wire shapes (``{"code": 0, "msg": "success", "data": {...}}``)
for the endpoints Ethan uses: tenant/app access tokens, bot info, IM messages (create, reply,
edit, recall, get, reactions), CardKit card entities (create, streaming element content,
settings, full update), chat info and contact users, and Feishu documents with who may read
them (drive permission settings, collaborators, owners; the section at the end). It runs an
aiohttp app on 127.0.0.1 with an ephemeral port, on **its own thread and event loop**: lark-oapi
fetches tokens with blocking ``requests`` calls, so a fake served from the test's own loop
would deadlock.

Typical use::

    with FakeLark() as lark:                      # or lark.start() / lark.stop()
        client = lark_oapi.Client.builder().app_id("cli_test").app_secret("s") \
            .domain(lark.base_url).build()
        ...                                       # drive the bot
        [msg] = lark.wait_for_messages(1)         # sync; use `await ..._async` in async tests
        assert msg.kind == "reply" and "hello" in msg.text

Inspection (all thread-safe, all return snapshots):
    ``calls`` / ``calls_to(substr, method=None)``  every HTTP request, as :class:`Call`
    ``messages()``                               distinct deliveries after uuid dedup
    ``card(card_id)`` / ``card_text(card_id)``   CardKit entity state / its visible text
    ``reactions()``, ``token_fetches``, ``max_sends_per_second(chat_id=None)``

Behaviour knobs:
    ``expire_tokens()``                 every issued token becomes invalid (code 99991663)
    ``fail_next(path_substr, ...)``     scripted failures (rate limits, 5xx, lost responses...)
    ``set_down(seconds)``               every request answers 503 (or resets) for a while
    ``stall_next(path_substr, seconds)`` hold matching requests, then answer them normally
    ``latency``                         seconds slept before answering each request
    ``enforce_chat_qps``                answer 230020 above N sends per chat per second
    ``register_inbound(event)``         teach the fake about a message the bot will reply to
    ``recall_message(message_id)``      the message is withdrawn (replies/edits get 230011)

Error statuses follow the Open Platform docs: business errors are HTTP 400 with a non-zero
``code``; the gateway's rate limit is HTTP 429 + code 99991400 + ``x-ogw-ratelimit-reset``;
an invalid token is HTTP 400 + code 99991663 (``invalid_token_status`` to change it).

Note on lark-oapi: its ``TokenManager`` caches tokens in a process-wide cache keyed by app_id
and never refreshes on 99991663. ``start()`` therefore clears lark-oapi's cached self-built
tokens (see :func:`reset_lark_sdk_token_cache`) so each fake starts from a fresh token fetch.

This module also hosts :class:`ThreadedAiohttpServer`, the base shared with the fake
Anthropic server.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qs

from aiohttp import web

__all__ = [
    "Call",
    "CardState",
    "FakeLark",
    "SentMessage",
    "ThreadedAiohttpServer",
    "chat_rate_limited",
    "extract_text",
    "rate_limited",
    "reset_lark_sdk_token_cache",
    "server_error",
    "token_invalid",
]

JSON_CT = "application/json; charset=utf-8"


# --------------------------------------------------------------------------------------------
# Shared base: an aiohttp app on its own thread and loop
# --------------------------------------------------------------------------------------------


class ThreadedAiohttpServer:
    """Run an aiohttp application on 127.0.0.1:<ephemeral> in a private thread + event loop.

    Subclasses implement :meth:`_build_app`. ``start()`` blocks until the socket is bound;
    ``stop()`` shuts the server down (releasing any request parked with :meth:`_park`) and
    joins the thread. Both are idempotent; the object is also a (sync) context manager.
    """

    host = "127.0.0.1"
    #: seconds aiohttp waits for in-flight requests on stop before dropping them
    shutdown_timeout = 0.5

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._port: int | None = None
        self.internal_errors: list[str] = []  # exceptions raised inside handlers (a fake bug)

    # -- public ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._port is not None

    def start(self, timeout: float = 10.0):
        if self._thread is not None:
            return self
        self._ready.clear()
        self._start_error = None
        self._thread = threading.Thread(
            target=self._thread_main, name=f"{type(self).__name__}-server", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{type(self).__name__} did not start within {timeout}s")
        if self._start_error is not None:
            self._thread.join(1)
            self._thread = None
            raise RuntimeError(f"{type(self).__name__} failed to start") from self._start_error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            self._thread = None
            return
        if not loop.is_closed() and loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._async_shutdown(), loop)
            try:
                fut.result(timeout)
            except Exception:  # pragma: no cover - best effort on teardown
                pass
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._port = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- for subclasses -------------------------------------------------------------------
    def _build_app(self) -> web.Application:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _park(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` on the server loop; return True if woken by ``stop()``."""
        assert self._stopping is not None
        if seconds <= 0:
            return self._stopping.is_set()
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    @staticmethod
    def _drop_connection(request: web.BaseRequest) -> None:
        """Close the TCP connection without an HTTP answer (the client sees a reset)."""
        transport = request.transport
        if transport is not None:
            transport.abort() if hasattr(transport, "abort") else transport.close()

    # -- internals ------------------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._async_start())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._start_error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(self._async_shutdown())
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _async_start(self) -> None:
        self._stopping = asyncio.Event()
        app = self._build_app()
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def _async_shutdown(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def _wait_until(
    predicate: Callable[[], Any], timeout: float, describe: Callable[[], str], what: str
) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            f"{what}() blocks; called from a running event loop it would starve the code under "
            f"test. Use `await {what}_async(...)` instead."
        )
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(describe())
        time.sleep(0.01)


async def _await_until(
    predicate: Callable[[], Any], timeout: float, describe: Callable[[], str]
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(describe())
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One HTTP request the fake received (``status``/``code`` filled once answered)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    json: Any
    at: float
    body: bytes = b""
    query_string: str = ""
    status: int | None = None
    code: int | None = None  # Lark business code of the answer, None if not JSON

    def header(self, name: str, default: str | None = None) -> str | None:
        """Case-insensitive header lookup."""
        lname = name.lower()
        for k, v in self.headers.items():
            if k.lower() == lname:
                return v
        return default

    def __repr__(self) -> str:  # compact, for failure dumps
        return f"<Call {self.method} {self.path} -> {self.status}/{self.code}>"


@dataclass(frozen=True)
class SentMessage:
    """A message the bot delivered (snapshot). ``text`` is the *current* visible text: edits
    and, for card references, the card entity's latest streamed content are applied."""

    message_id: str
    kind: str  # "create" | "reply"
    chat_id: str | None  # None when replying to a message the fake was never told about
    receive_id: str | None  # create only
    receive_id_type: str | None  # create only
    reply_to: str | None  # reply only: the parent message_id
    reply_in_thread: bool
    thread_id: str
    root_id: str
    msg_type: str
    content: dict  # the parsed content as sent (first version)
    text: str
    uuid: str | None
    at: float
    card_id: str | None = None  # interactive messages that reference a CardKit entity
    current_content: dict | None = None  # after edits (== content when never edited)
    edits: int = 0
    recalled: bool = False


@dataclass
class CardState:
    """A CardKit card entity (snapshot when returned by :meth:`FakeLark.card`)."""

    card_id: str
    card: dict  # the card JSON (latest full version)
    streaming_mode: bool
    sequence: int  # the last accepted sequence
    element_texts: dict[str, str]  # element_id -> latest streamed full text
    history: list[dict] = field(default_factory=list)  # accepted operations, in order
    sent_as: str | None = None  # message_id that carries the card
    text: str = ""  # visible text (element overrides applied)


def rate_limited(reset: int | float = 1, *, status: int = 429) -> dict:
    """Open Platform gateway rate limit: HTTP 429, code 99991400, ``x-ogw-ratelimit-reset``."""
    return {
        "status": status,
        "code": 99991400,
        "msg": "request trigger frequency limit",
        "headers": {"x-ogw-ratelimit-limit": "50", "x-ogw-ratelimit-reset": str(reset)},
    }


def chat_rate_limited() -> dict:
    """IM per-chat frequency limit: HTTP 400, code 230020."""
    return {"status": 400, "code": 230020, "msg": "This operation triggers the frequency limit."}


def token_invalid() -> dict:
    """An access token the platform no longer accepts: HTTP 400, code 99991663."""
    return {
        "status": 400,
        "code": 99991663,
        "msg": "Invalid access token for authorization. Please make a request with token attached.",
    }


def server_error(status: int = 500) -> dict:
    return {"status": status, "code": 1500 if status == 500 else status, "msg": "internal error"}


@dataclass
class _Fault:
    substr: str
    method: str | None
    times: int
    status: int
    code: int
    msg: str
    headers: dict[str, str]
    deliver: bool
    disconnect: bool

    def matches(self, method: str, path: str) -> bool:
        return self.substr in path and (self.method is None or self.method == method)


@dataclass
class _Msg:
    message_id: str
    kind: str
    chat_id: str | None
    receive_id: str | None
    receive_id_type: str | None
    reply_to: str | None
    reply_in_thread: bool
    thread_id: str
    root_id: str
    parent_id: str
    msg_type: str
    raw_content: str
    content: dict
    uuid: str | None
    at: float
    create_ms: int
    card_id: str | None = None
    current_type: str = ""
    current_raw: str = ""
    edits: int = 0
    recalled: bool = False
    inbound: bool = False  # registered from an event (not sent by the bot)
    sender_id: str = ""


class _Reject(Exception):
    def __init__(self, code: int, msg: str, status: int = 400):
        super().__init__(msg)
        self.code, self.msg, self.status = code, msg, status


# --------------------------------------------------------------------------------------------
# Text extraction
# --------------------------------------------------------------------------------------------

_SKIP_TAGS_PREFIX = ("button", "select", "multi_select", "overflow", "input", "date", "picker", "checker")
_SKIP_KEYS = {"header", "config", "card_link", "i18n_header", "behaviors"}


def _card_texts(node: Any, overrides: dict[str, str] | None = None) -> list[str]:
    out: list[str] = []

    def walk(n: Any) -> None:
        if isinstance(n, list):
            for item in n:
                walk(item)
            return
        if not isinstance(n, dict):
            return
        tag = n.get("tag")
        if isinstance(tag, str) and tag.startswith(_SKIP_TAGS_PREFIX):
            return
        eid = n.get("element_id")
        if overrides and isinstance(eid, str) and eid in overrides:
            out.append(overrides[eid])
            return
        if tag in ("markdown", "lark_md", "plain_text") and isinstance(n.get("content"), str):
            out.append(n["content"])
            return
        for key, value in n.items():
            if key in _SKIP_KEYS:
                continue
            walk(value)

    walk(node)
    return [t for t in out if t]


def _post_text(content: dict) -> str:
    body = content
    if "post" in body and isinstance(body["post"], dict):
        body = body["post"]
    if "content" not in body:  # locale-keyed: {"zh_cn": {...}}
        locales = [v for v in body.values() if isinstance(v, dict)]
        body = locales[0] if locales else {}
    lines: list[str] = []
    if body.get("title"):
        lines.append(str(body["title"]))
    for paragraph in body.get("content") or []:
        parts = []
        for el in paragraph if isinstance(paragraph, list) else []:
            if not isinstance(el, dict):
                continue
            tag = el.get("tag")
            if tag == "at":
                parts.append("@" + str(el.get("user_name") or el.get("user_id") or ""))
            elif tag in ("img", "media", "emotion", "hr"):
                continue
            elif "text" in el:
                parts.append(str(el["text"]))
        lines.append("".join(parts))
    return "\n".join(lines)


def extract_text(msg_type: str, content: dict, overrides: dict[str, str] | None = None) -> str:
    """Best-effort visible text of a message ``content`` dict (text, post, interactive)."""
    if not isinstance(content, dict):
        return ""
    if msg_type == "text":
        return str(content.get("text", ""))
    if msg_type == "post":
        return _post_text(content)
    if msg_type == "interactive":
        card = content
        if content.get("type") == "card_json" and isinstance(content.get("data"), str):
            try:
                card = json.loads(content["data"])
            except ValueError:
                return ""
        body = card.get("body") if isinstance(card.get("body"), dict) else card
        return "\n".join(_card_texts(body, overrides))
    return ""


# --------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------

_ID_TYPES = {"open_id", "user_id", "union_id", "email", "chat_id"}
_TEXT_LIMIT = 150 * 1024
_RICH_LIMIT = 30 * 1024
_token_counter = itertools.count(1)  # process-wide: tokens of different fakes never collide


def reset_lark_sdk_token_cache() -> None:
    """Forget lark-oapi's cached self-built app/tenant tokens (process-wide cache)."""
    try:
        from lark_oapi.core.token.manager import TokenManager
    except ImportError:  # pragma: no cover
        return
    store = getattr(TokenManager.cache, "cache", None)
    if isinstance(store, dict):
        for key in list(store):
            if key.startswith(("self_tenant_token:", "self_app_token:", "isv_")):
                store.pop(key, None)


class FakeLark(ThreadedAiohttpServer):
    """Fake Lark Open API. See the module docstring for the overview."""

    def __init__(
        self,
        *,
        bot_open_id: str = "ou_bot",
        bot_name: str = "Ethan",
        app_id: str | None = None,
        app_secret: str | None = None,
        token_ttl: int = 7200,
        users: dict[str, str] | None = None,
        chats: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.bot_open_id = bot_open_id
        self.bot_name = bot_name
        self.app_id = app_id  # when set, token requests must carry this app_id ...
        self.app_secret = app_secret  # ... and this secret
        self.token_ttl = token_ttl
        self.users: dict[str, str] = {"ou_alice": "Alice", "ou_bob": "Bob", **(users or {})}
        self.chats: dict[str, str] = dict(chats or {})
        # chat_id -> chat_mode ("topic" for a topic-mode group: group_message_type "thread")
        self.chat_modes: dict[str, str] = {}
        self.list_pages = 0      # message-list pages served
        self.latency: float = 0.0
        self.enforce_chat_qps: int | None = None
        self.invalid_token_status: int = 400
        self.card_streaming_timeout: float = 600.0  # CardKit closes streaming after 10 min
        self.ws = None  # a FakeLarkWs (tests/fakes/fake_lark_ws.py) answers /callback/ws/endpoint

        self._lock = threading.RLock()
        self._calls: list[Call] = []
        self._faults: list[_Fault] = []
        self._stalls: list[list] = []  # [path substring, method or None, times, seconds]
        self._down_until = 0.0
        self._down_mode = "503"
        self._tokens: dict[str, float] = {}  # token -> monotonic issue time
        self._revoked: set[str] = set()
        self._token_fetches = 0
        self._msgs: dict[str, _Msg] = {}
        self._order: list[str] = []  # message ids sent by the bot, in delivery order
        self._uuids: dict[str, str] = {}  # uuid -> message_id
        self._send_times: dict[str | None, list[float]] = {}
        self._cards: dict[str, CardState] = {}
        self._card_uuids: dict[tuple[str, str], str] = {}
        self._card_started: dict[str, float] = {}
        self._reactions: list[dict] = []
        self._resources: dict[tuple[str, str], tuple[bytes, str]] = {}   # (message_id, key) -> bytes
        self._children: dict[str, list[dict]] = {}   # merge_forward bundle -> its children
        self._denied: dict[str, int] = {}            # message id -> the code GET answers
        self._ids = itertools.count(1)
        self._log_ids = itertools.count(1)

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 10.0):
        reset_lark_sdk_token_cache()
        return super().start(timeout)

    # ---- inspection ---------------------------------------------------------------------
    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def calls_to(self, substr: str, method: str | None = None) -> list[Call]:
        """Calls whose path contains ``substr`` (e.g. ``"reply"``, ``"/cardkit/"``)."""
        method = method.upper() if method else None
        return [c for c in self.calls if substr in c.path and (method is None or c.method == method)]

    @property
    def token_fetches(self) -> int:
        """Successful tenant/app access-token fetches so far."""
        with self._lock:
            return self._token_fetches

    def messages(self, *, chat_id: str | None = None, kind: str | None = None) -> list[SentMessage]:
        """Distinct messages the bot delivered (uuid duplicates collapsed), in order."""
        with self._lock:
            out = [self._snapshot(self._msgs[mid]) for mid in self._order]
        if chat_id is not None:
            out = [m for m in out if m.chat_id == chat_id]
        if kind is not None:
            out = [m for m in out if m.kind == kind]
        return out

    def message(self, message_id: str) -> SentMessage:
        with self._lock:
            return self._snapshot(self._msgs[message_id])

    def wait_for_messages(self, n: int, timeout: float = 5.0, **filters) -> list[SentMessage]:
        """Block (polling) until at least ``n`` messages are delivered; return them all.

        Raises ``AssertionError`` with a dump of deliveries and recent calls on timeout.
        Refuses to run inside a running event loop: use :meth:`wait_for_messages_async`.
        """
        return _wait_until(
            lambda: (lambda ms: ms if len(ms) >= n else None)(self.messages(**filters)),
            timeout, lambda: self._dump(f"expected {n} delivered message(s) within {timeout}s"),
            "wait_for_messages",
        )

    async def wait_for_messages_async(self, n: int, timeout: float = 5.0, **filters) -> list[SentMessage]:
        return await _await_until(
            lambda: (lambda ms: ms if len(ms) >= n else None)(self.messages(**filters)),
            timeout, lambda: self._dump(f"expected {n} delivered message(s) within {timeout}s"),
        )

    def card(self, card_id: str) -> CardState:
        with self._lock:
            st = self._cards[card_id]
            snap = copy.deepcopy(st)
            snap.text = self._card_text_locked(st)
            return snap

    def cards(self) -> list[CardState]:
        with self._lock:
            ids = list(self._cards)
        return [self.card(c) for c in ids]

    def card_text(self, card_id: str) -> str:
        """Visible text of a card entity: its JSON with each element's latest streamed text."""
        with self._lock:
            return self._card_text_locked(self._cards[card_id])

    def reactions(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self._reactions]

    def send_times(self, chat_id: str | None) -> list[float]:
        """Monotonic timestamps of deliveries into ``chat_id``."""
        with self._lock:
            return list(self._send_times.get(chat_id, []))

    def max_sends_per_second(self, chat_id: str | None = None) -> int:
        """Largest number of deliveries into one chat within any 1-second window: for
        ``chat_id``, or the worst chat when ``chat_id`` is None."""
        with self._lock:
            series = (
                list(self._send_times.values())
                if chat_id is None
                else [self._send_times.get(chat_id, [])]
            )
        best = 0
        for times in series:
            j = 0
            for i, t in enumerate(times):
                while times[j] <= t - 1.0:
                    j += 1
                best = max(best, i - j + 1)
        return best

    # ---- knobs --------------------------------------------------------------------------
    def expire_tokens(self) -> None:
        """Invalidate every token issued so far; their next use answers code 99991663."""
        with self._lock:
            self._revoked.update(self._tokens)

    def fail_next(
        self,
        path_substring: str,
        *,
        times: int = 1,
        status: int = 400,
        code: int | None = None,
        msg: str | None = None,
        headers: dict[str, str] | None = None,
        method: str | None = None,
        deliver: bool = False,
        disconnect: bool = False,
    ) -> None:
        """Make the next ``times`` requests whose path contains ``path_substring`` fail.

        The answer is HTTP ``status`` with ``{"code": code, "msg": msg}`` and extra ``headers``
        (defaults: 429 -> code 99991400; otherwise code 1500 / the given status). Presets:
        ``fail_next("reply", **rate_limited(1))``, ``**chat_rate_limited()``,
        ``**token_invalid()``, ``**server_error()``.

        ``deliver=False`` (default): nothing happens server-side (no message is delivered, no
        uuid is consumed). ``deliver=True``: the request IS processed, then its answer is
        replaced by the failure -- the "lost response" case a uuid retry must survive.
        ``disconnect=True``: the connection is reset instead of answering.
        """
        if code is None:
            code = 99991400 if status == 429 else (1500 if status in (200, 400, 500) else status)
        with self._lock:
            self._faults.append(
                _Fault(path_substring, method.upper() if method else None, times, status, code,
                       msg or "fake failure", dict(headers or {}), deliver, disconnect)
            )

    def stall_next(self, path_substring: str, seconds: float, *, method: str | None = None,
                   times: int = 1) -> None:
        """Hold the next ``times`` matching requests for ``seconds`` before answering them
        normally (a slow Open API call in flight when the bot is stopped)."""
        with self._lock:
            self._stalls.append([path_substring, method.upper() if method else None, times, seconds])

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._stalls.clear()

    def set_down(self, seconds: float, *, mode: str = "503") -> None:
        """Answer every request with HTTP 503 (``mode="503"``, a non-JSON gateway page) or by
        resetting the connection (``mode="reset"``) for ``seconds``; 0 brings it back up."""
        if mode not in ("503", "reset"):
            raise ValueError("mode must be '503' or 'reset'")
        with self._lock:
            self._down_until = time.monotonic() + seconds if seconds > 0 else 0.0
            self._down_mode = mode

    def register_inbound(self, event: dict) -> None:
        """Tell the fake about an inbound message (a schema 2.0 event dict) so replies to it get
        its chat_id/thread and GET returns it."""
        msg = (event.get("event") or {}).get("message") or {}
        mid = msg.get("message_id")
        if not mid:
            raise ValueError("event has no event.message.message_id")
        try:
            content = json.loads(msg.get("content") or "{}")
        except ValueError:
            content = {}
        sender = ((event.get("event") or {}).get("sender") or {}).get("sender_id") or {}
        with self._lock:
            self._msgs[mid] = _Msg(
                message_id=mid, kind="inbound", chat_id=msg.get("chat_id"), receive_id=None,
                receive_id_type=None, reply_to=msg.get("parent_id") or None, reply_in_thread=False,
                thread_id=msg.get("thread_id") or "", root_id=msg.get("root_id") or "",
                parent_id=msg.get("parent_id") or "", msg_type=msg.get("message_type") or "text",
                raw_content=msg.get("content") or "{}", content=content, uuid=None,
                at=time.time(), create_ms=int(msg.get("create_time") or time.time() * 1000),
                current_type=msg.get("message_type") or "text",
                current_raw=msg.get("content") or "{}", inbound=True,
                sender_id=sender.get("open_id", ""),
            )

    def recall_message(self, message_id: str) -> None:
        """Mark a message withdrawn: replying to / editing it answers code 230011."""
        with self._lock:
            m = self._msgs.get(message_id)
            if m is None:
                self._msgs[message_id] = _Msg(
                    message_id, "inbound", None, None, None, None, False, "", "", "", "text", "{}",
                    {}, None, time.time(), int(time.time() * 1000), inbound=True, recalled=True,
                )
            else:
                m.recalled = True

    def clear(self) -> None:
        """Forget recorded calls, deliveries, cards, reactions and faults (tokens stay valid)."""
        with self._lock:
            self._calls.clear()
            self._faults.clear()
            self._stalls.clear()
            self._msgs.clear()
            self._order.clear()
            self._uuids.clear()
            self._send_times.clear()
            self._cards.clear()
            self._card_uuids.clear()
            self._card_started.clear()
            self._reactions.clear()
            self._resources.clear()
            self._children.clear()
            self._denied.clear()

    # ---- server -------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    _ROUTES: list[tuple[str, re.Pattern, str, bool]] = [
        (m, re.compile(p + r"\Z"), h, auth)
        for (m, p, h, auth) in [
            ("POST", r"/open-apis/auth/v3/tenant_access_token/internal/?", "_h_tenant_token", False),
            ("POST", r"/open-apis/auth/v3/app_access_token/internal/?", "_h_app_token", False),
            ("GET", r"/open-apis/bot/v3/info/?", "_h_bot_info", True),
            ("POST", r"/callback/ws/endpoint", "_h_ws_endpoint", False),
            ("POST", r"/open-apis/im/v1/messages", "_h_create", True),
            ("GET", r"/open-apis/im/v1/messages", "_h_list", True),
            ("POST", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)/reply", "_h_reply", True),
            ("PATCH", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)", "_h_patch", True),
            ("PUT", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)", "_h_update", True),
            ("GET", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)", "_h_get", True),
            ("GET", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)/resources/(?P<key>[^/]+)", "_h_resource", True),
            ("DELETE", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)", "_h_delete", True),
            ("POST", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)/reactions", "_h_react", True),
            ("DELETE", r"/open-apis/im/v1/messages/(?P<mid>[^/]+)/reactions/(?P<rid>[^/]+)", "_h_unreact", True),
            ("GET", r"/open-apis/im/v1/chats/(?P<cid>[^/]+)", "_h_chat", True),
            ("POST", r"/open-apis/cardkit/v1/cards", "_h_card_create", True),
            ("PUT", r"/open-apis/cardkit/v1/cards/(?P<card>[^/]+)", "_h_card_update", True),
            ("PATCH", r"/open-apis/cardkit/v1/cards/(?P<card>[^/]+)/settings", "_h_card_settings", True),
            ("PUT", r"/open-apis/cardkit/v1/cards/(?P<card>[^/]+)/elements/(?P<el>[^/]+)/content", "_h_card_content", True),
            ("GET", r"/open-apis/contact/v3/users/batch", "_h_users_batch", True),
            ("GET", r"/open-apis/contact/v3/users/(?P<uid>[^/]+)", "_h_user", True),
        ]
    ]

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        call = Call(
            method=request.method, path=request.path,
            query={k: v for k, v in request.query.items()},
            headers={k: v for k, v in request.headers.items()},
            json=parsed, at=time.time(), body=body, query_string=request.query_string,
        )
        with self._lock:
            self._calls.append(call)

        if self.latency > 0:
            if await self._park(self.latency):
                return web.Response(status=503)

        with self._lock:
            stall = next((st for st in self._stalls if st[0] in request.path
                          and st[1] in (None, request.method)), None)
            if stall is not None:
                stall[2] -= 1
                if stall[2] <= 0:
                    self._stalls.remove(stall)
        if stall is not None and await self._park(stall[3]):
            return web.Response(status=503)

        with self._lock:
            down = time.monotonic() < self._down_until
            down_mode = self._down_mode
            fault = next((f for f in self._faults if f.matches(request.method, request.path)), None)
            if fault is not None and not down:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
        if down:
            call.status = 503
            if down_mode == "reset":
                self._drop_connection(request)
                return web.Response(status=503)
            return web.Response(
                status=503, content_type="text/html",
                text="<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>",
            )
        if fault is not None and not fault.deliver:
            return self._fault_response(request, call, fault)

        try:
            routed = self._route(request, call, parsed)
            if isinstance(routed, web.StreamResponse):   # a resource's bytes, not JSON
                call.status = routed.status
                return routed
            status, payload, headers = routed
        except Exception as exc:  # a bug in the fake: answer 500 and remember it
            import traceback

            with self._lock:
                self.internal_errors.append(traceback.format_exc())
            status, payload, headers = 500, {"code": 1500, "msg": f"fake internal error: {exc!r}"}, {}

        if fault is not None:  # deliver=True: processed, but the answer is lost/replaced
            return self._fault_response(request, call, fault)
        return self._json(call, status, payload, headers)

    def _fault_response(self, request: web.Request, call: Call, fault: _Fault) -> web.StreamResponse:
        if fault.disconnect:
            call.status = None
            self._drop_connection(request)
            return web.Response(status=500)
        return self._json(call, fault.status, {"code": fault.code, "msg": fault.msg,
                                               "error": {"log_id": self._log_id()}}, fault.headers)

    def _log_id(self) -> str:
        return f"fake{next(self._log_ids):016d}"

    def _json(self, call: Call, status: int, payload: dict, headers: dict | None) -> web.Response:
        call.status = status
        call.code = payload.get("code") if isinstance(payload, dict) else None
        hdrs = {"X-Tt-Logid": self._log_id(), **(headers or {})}
        return web.Response(
            status=status, body=json.dumps(payload, ensure_ascii=False).encode(),
            content_type="application/json", charset="utf-8", headers=hdrs,
        )

    def _route(self, request: web.Request, call: Call, body: Any) -> tuple[int, dict, dict]:
        path_known = False
        for method, pattern, handler, auth in self._ROUTES:
            m = pattern.match(request.path)
            if not m:
                continue
            path_known = True
            if method != request.method:
                continue
            if auth:
                err = self._check_auth(call)
                if err is not None:
                    return err
            try:
                return getattr(self, handler)(call, body if isinstance(body, dict) else {}, **m.groupdict())
            except _Reject as r:
                return r.status, {"code": r.code, "msg": r.msg, "error": {"log_id": self._log_id()}}, {}
        what = "method not allowed" if path_known else "404 page not found"
        return 404, {"code": 404, "msg": f"{what}: {request.method} {request.path} (fake lark)"}, {}

    def _check_auth(self, call: Call) -> tuple[int, dict, dict] | None:
        auth = call.header("Authorization") or ""
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        if not token or token == "None":
            return 400, {"code": 99991661, "msg": "Missing access token for authorization. "
                         "Please make a request with token attached."}, {}
        with self._lock:
            issued = self._tokens.get(token)
            ok = (issued is not None and token not in self._revoked
                  and time.monotonic() < issued + self.token_ttl)
        if not ok:
            return self.invalid_token_status, {"code": 99991663, "msg": token_invalid()["msg"]}, {}
        return None

    # ---- auth / bot ---------------------------------------------------------------------
    def _issue_token(self, body: dict) -> tuple[int, dict, dict] | str:
        if self.app_id is not None and body.get("app_id") != self.app_id:
            raise _Reject(10003, "invalid param: app_id")
        if self.app_secret is not None and body.get("app_secret") != self.app_secret:
            raise _Reject(10014, "app secret invalid")
        token = f"t-{next(_token_counter)}"
        with self._lock:
            self._tokens[token] = time.monotonic()
            self._token_fetches += 1
        return token

    def _h_tenant_token(self, call, body):
        token = self._issue_token(body)
        return 200, {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_ttl}, {}

    def _h_app_token(self, call, body):
        token = self._issue_token(body)
        return 200, {"code": 0, "msg": "ok", "app_access_token": "a-" + token[2:],
                     "tenant_access_token": token, "expire": self.token_ttl}, {}

    def _h_ws_endpoint(self, call, body):
        if self.ws is None:
            return 404, {"code": 404, "msg": "no long-connection server (fake lark)"}, {}
        return self.ws.endpoint(body)

    def _h_bot_info(self, call, body):
        # bot/v3/info puts `bot` at the top level, next to code/msg (no `data` envelope)
        return 200, {"code": 0, "msg": "ok", "bot": {
            "activate_status": 2, "app_name": self.bot_name,
            "avatar_url": "https://example.invalid/avatar.png", "ip_white_list": [],
            "open_id": self.bot_open_id,
        }}, {}

    # ---- messages -----------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    @staticmethod
    def _ok(data: dict) -> tuple[int, dict, dict]:
        return 200, {"code": 0, "msg": "success", "data": data}, {}

    def _parse_content(self, msg_type: Any, raw: Any) -> dict:
        if not isinstance(msg_type, str) or not msg_type:
            raise _Reject(230001, "Your request contains an invalid request parameter. msg_type is empty")
        if not isinstance(raw, str) or not raw:
            raise _Reject(230001, "Your request contains an invalid request parameter. content is empty")
        try:
            content = json.loads(raw)
        except ValueError:
            raise _Reject(230001, "invalid message content: content is not a JSON string") from None
        if not isinstance(content, dict):
            raise _Reject(230001, "invalid message content: content must be a JSON object")
        size = len(raw.encode())
        if msg_type == "text":
            if not isinstance(content.get("text"), str):
                raise _Reject(230001, "invalid message content: text message needs a `text` field")
            if size > _TEXT_LIMIT:
                raise _Reject(230025, "The length of the message content reaches its limit.")
        elif msg_type in ("post", "interactive") and size > _RICH_LIMIT:
            raise _Reject(230025, "The length of the message content reaches its limit.")
        if msg_type == "interactive" and content.get("type") == "card":
            card_id = (content.get("data") or {}).get("card_id")
            with self._lock:
                st = self._cards.get(card_id)
            if st is None:
                raise _Reject(230099, f"Failed to create card content, ext=ErrCode: 200740; "
                              f"ErrMsg: card entity {card_id!r} not exist")
            if st.sent_as is not None:
                raise _Reject(230099, "Failed to create card content, ext=card entity has already been sent")
        return content

    def _deliver(self, *, kind: str, body: dict, chat_id: str | None, receive_id=None,
                 receive_id_type=None, parent: _Msg | None = None) -> tuple[int, dict, dict]:
        uuid = body.get("uuid") or None
        with self._lock:
            if uuid and uuid in self._uuids:  # idempotent retry: the same message, no new delivery
                return self._ok(self._message_data(self._msgs[self._uuids[uuid]]))
        msg_type = body.get("msg_type")
        content = self._parse_content(msg_type, body.get("content"))
        reply_in_thread = bool(body.get("reply_in_thread")) if kind == "reply" else False
        with self._lock:
            if uuid and uuid in self._uuids:  # raced with an identical retry
                return self._ok(self._message_data(self._msgs[self._uuids[uuid]]))
            now_m = time.monotonic()
            if self.enforce_chat_qps is not None:
                recent = [t for t in self._send_times.get(chat_id, []) if t > now_m - 1.0]
                if len(recent) >= self.enforce_chat_qps:
                    raise _Reject(230020, "This operation triggers the frequency limit.")
            mid = self._new_id("om_fake_")
            thread_id, root_id, parent_id = "", "", ""
            if parent is not None:
                parent_id = parent.message_id
                root_id = parent.root_id or parent.message_id
                thread_id = parent.thread_id
                if reply_in_thread and not thread_id:
                    thread_id = self._new_id("omt_fake_")
                    parent.thread_id = thread_id
            card_id = None
            if msg_type == "interactive" and content.get("type") == "card":
                card_id = content["data"]["card_id"]
                self._cards[card_id].sent_as = mid
            m = _Msg(
                message_id=mid, kind=kind, chat_id=chat_id, receive_id=receive_id,
                receive_id_type=receive_id_type, reply_to=parent_id or None,
                reply_in_thread=reply_in_thread, thread_id=thread_id, root_id=root_id,
                parent_id=parent_id, msg_type=msg_type, raw_content=body["content"], content=content,
                uuid=uuid, at=time.time(), create_ms=int(time.time() * 1000), card_id=card_id,
                current_type=msg_type, current_raw=body["content"], sender_id=self.bot_open_id,
            )
            self._msgs[mid] = m
            self._order.append(mid)
            if uuid:
                self._uuids[uuid] = mid
            self._send_times.setdefault(chat_id, []).append(now_m)
            return self._ok(self._message_data(m))

    def _message_data(self, m: _Msg) -> dict:
        return {
            "message_id": m.message_id, "root_id": m.root_id, "parent_id": m.parent_id,
            "thread_id": m.thread_id, "msg_type": m.current_type or m.msg_type,
            "create_time": str(m.create_ms), "update_time": str(m.create_ms),
            "deleted": m.recalled, "updated": m.edits > 0,
            "chat_id": m.chat_id or "oc_fake_unknown",
            "sender": ({"id": m.sender_id, "id_type": "open_id", "sender_type": "user",
                        "tenant_key": "tk_fake"} if m.inbound else
                       {"id": "cli_fake", "id_type": "app_id", "sender_type": "app",
                        "tenant_key": "tk_fake"}),
            "body": {"content": m.current_raw or m.raw_content},
            "mentions": [],
            "upper_message_id": "",
        }

    def _h_create(self, call, body):
        rtype = call.query.get("receive_id_type")
        if rtype not in _ID_TYPES:
            raise _Reject(99992402, "field validation failed: receive_id_type is required "
                          "(open_id|user_id|union_id|email|chat_id)")
        receive_id = body.get("receive_id")
        if not isinstance(receive_id, str) or not receive_id:
            raise _Reject(99992402, "field validation failed: receive_id is required")
        chat_id = receive_id if rtype == "chat_id" else f"oc_p2p_{receive_id}"
        return self._deliver(kind="create", body=body, chat_id=chat_id, receive_id=receive_id,
                             receive_id_type=rtype)

    def _lookup(self, mid: str, *, allow_unknown: bool) -> _Msg | None:
        with self._lock:
            m = self._msgs.get(mid)
        if m is not None and m.recalled:
            raise _Reject(230011, "The message is recalled.")
        if m is None and not allow_unknown:
            raise _Reject(230001, f"Your request contains an invalid request parameter: "
                          f"message_id {mid!r} not found")
        return m

    def _h_reply(self, call, body, mid):
        parent = self._lookup(mid, allow_unknown=True)
        if parent is None:  # an inbound message the fake was not told about
            parent = _Msg(mid, "inbound", None, None, None, None, False, "", "", "", "text", "{}",
                          {}, None, time.time(), int(time.time() * 1000), inbound=True)
            with self._lock:
                self._msgs.setdefault(mid, parent)
                parent = self._msgs[mid]
        return self._deliver(kind="reply", body=body, chat_id=parent.chat_id, parent=parent)

    def _edit(self, mid: str, msg_type: str, raw: Any) -> tuple[int, dict, dict]:
        m = self._lookup(mid, allow_unknown=False)
        if m.inbound:
            raise _Reject(230001, "Your request contains an invalid request parameter: "
                          "the bot is not the sender of this message")
        content = self._parse_content(msg_type, raw)
        with self._lock:
            m.current_type, m.current_raw, m.edits = msg_type, raw, m.edits + 1
            if msg_type == "interactive" and content.get("type") == "card":
                m.card_id = content["data"]["card_id"]
            return self._ok(self._message_data(m))

    def _h_patch(self, call, body, mid):
        m = self._lookup(mid, allow_unknown=False)
        if (m.current_type or m.msg_type) != "interactive":
            raise _Reject(230001, "Your request contains an invalid request parameter: "
                          "only interactive (card) messages can be patched")
        status, payload, hdrs = self._edit(mid, "interactive", body.get("content"))
        return 200, {"code": 0, "msg": "success", "data": {}}, hdrs

    def _h_update(self, call, body, mid):
        msg_type = body.get("msg_type")
        if msg_type not in ("text", "post"):
            raise _Reject(230001, "Your request contains an invalid request parameter: "
                          "only text and post messages can be edited")
        return self._edit(mid, msg_type, body.get("content"))

    def _h_get(self, call, body, mid):
        with self._lock:
            denied = self._denied.get(mid)
        if denied is not None:   # another tenant's message, or a chat the bot cannot read
            raise _Reject(denied, "Lack of necessary permissions to read this message.")
        m = self._lookup(mid, allow_unknown=False)
        items = [self._message_data(m)]
        # A merged forward: Lark lists the bundle and then its children, each naming the
        # bundle as its upper_message_id.
        for child in self._children.get(mid, []):
            items.append(dict(child, upper_message_id=mid))
        return self._ok({"items": items})

    def _h_resource(self, call, body, mid, key):
        kind = call.query.get("type")
        if kind not in ("image", "file"):
            raise _Reject(234001, "Invalid request param: type must be image or file")
        with self._lock:
            res = self._resources.get((mid, key))
        if res is None:
            raise _Reject(234003, "File not in msg.")   # Lark's answer for a key not in this message
        data, content_type = res
        return web.Response(status=200, body=data, content_type=content_type,
                            headers={"X-Tt-Logid": self._log_id(),
                                     "Content-Disposition": f'attachment; filename="{key}"'})

    # ---- resources and forwarded bundles -------------------------------------------------
    def add_resource(self, message_id: str, key: str, data: bytes,
                     content_type: str = "application/octet-stream") -> None:
        """Serve ``data`` at GET /open-apis/im/v1/messages/{message_id}/resources/{key}."""
        with self._lock:
            self._resources[(message_id, key)] = (data, content_type)

    def add_message(self, message_id: str, chat_id: str, *, msg_type: str = "text",
                    content: dict | str | None = None, text: str = "", sender: str = "ou_bob",
                    create_ms: int | None = None) -> None:
        """A message users sent earlier (say, the one a reply quotes): GET answers it."""
        raw = content if isinstance(content, str) else json.dumps(
            content if content is not None else {"text": text}, ensure_ascii=False)
        ms = create_ms if create_ms is not None else int(time.time() * 1000)
        with self._lock:
            self._msgs[message_id] = _Msg(
                message_id, "inbound", chat_id, None, None, None, False, "", "", "", msg_type, raw,
                json.loads(raw) if raw.startswith("{") else {}, None, ms / 1000, ms,
                current_type=msg_type, current_raw=raw, inbound=True, sender_id=sender)

    def _h_list(self, call, body):
        """The message list of a chat (container_id_type=chat), as Lark pages it: start_time /
        end_time in seconds (inclusive), sort_type ByCreateTimeAsc (default) or
        ByCreateTimeDesc, page_size ≤ 50, an opaque page_token."""
        q = call.query
        if q.get("container_id_type") != "chat" or not q.get("container_id"):
            raise _Reject(230001, "Your request contains an invalid request parameter: container_id_type/container_id")
        chat = q["container_id"]
        with self._lock:
            denied = self._denied.get(chat)
        if denied is not None:
            raise _Reject(denied, "Access denied. One of the following scopes is required: "
                          "[im:message.group_msg, im:message.history:readonly]")
        size = int(q.get("page_size") or 20)
        if not 1 <= size <= 50:
            raise _Reject(230001, "Your request contains an invalid request parameter: page_size")
        lo = int(q["start_time"]) * 1000 if q.get("start_time") else None
        hi = int(q["end_time"]) * 1000 + 999 if q.get("end_time") else None
        with self._lock:
            rows = [m for m in self._msgs.values() if m.chat_id == chat
                    and (lo is None or m.create_ms >= lo) and (hi is None or m.create_ms <= hi)]
            rows.sort(key=lambda m: (m.create_ms, m.message_id), reverse=q.get("sort_type") == "ByCreateTimeDesc")
            start = int(q.get("page_token") or 0)
            page = [self._message_data(m) for m in rows[start:start + size]]
        more = start + size < len(rows)
        self.list_pages += 1
        return self._ok({"has_more": more, "page_token": str(start + size) if more else "", "items": page})

    def deny_message(self, message_id: str, code: int = 230027) -> None:
        """GET of ``message_id`` answers ``code`` (default: lack of necessary permissions)."""
        with self._lock:
            self._denied[message_id] = code

    def add_forward(self, message_id: str, chat_id: str, children: list[dict]) -> None:
        """Make ``message_id`` a merge_forward bundle with ``children``: dicts with ``sender``
        (open_id), ``text`` (or ``msg_type`` + ``content``) and ``create_ms``."""
        rows = []
        for i, c in enumerate(children):
            msg_type = c.get("msg_type", "text")
            content = c.get("content") or json.dumps({"text": c.get("text", "")}, ensure_ascii=False)
            rows.append({
                "message_id": c.get("message_id") or f"{message_id}_c{i}", "root_id": "", "parent_id": "",
                "thread_id": "", "msg_type": msg_type, "create_time": str(c.get("create_ms", int(time.time() * 1000))),
                "update_time": str(c.get("create_ms", int(time.time() * 1000))), "deleted": False,
                "updated": False, "chat_id": c.get("chat_id", "oc_forward_src"),
                "sender": {"id": c.get("sender", "ou_bob"), "id_type": "open_id", "sender_type": "user",
                           "tenant_key": "tk_fake"},
                "body": {"content": content}, "mentions": [],
            })
        with self._lock:
            self._children[message_id] = rows
            if message_id not in self._msgs:
                now = time.time()
                self._msgs[message_id] = _Msg(
                    message_id, "inbound", chat_id, None, None, None, False, "", "", "", "merge_forward",
                    json.dumps({"content": "Merged and Forwarded Message"}), {}, None, now, int(now * 1000),
                    current_type="merge_forward", inbound=True)

    def _h_delete(self, call, body, mid):
        m = self._lookup(mid, allow_unknown=False)
        with self._lock:
            m.recalled = True
        return self._ok({})

    def _h_react(self, call, body, mid):
        self._lookup(mid, allow_unknown=True)
        emoji = ((body.get("reaction_type") or {}).get("emoji_type"))
        if not emoji:
            raise _Reject(231001, "reaction type is invalid")
        rid = self._new_id("reaction_fake_")
        rec = {"reaction_id": rid, "message_id": mid, "emoji_type": emoji,
               "at": time.time(), "deleted": False}
        with self._lock:
            self._reactions.append(rec)
        return self._ok(self._reaction_data(rec))

    def _reaction_data(self, rec: dict) -> dict:
        return {"reaction_id": rec["reaction_id"],
                "operator": {"operator_id": "cli_fake", "operator_type": "app"},
                "action_time": str(int(rec["at"] * 1000)),
                "reaction_type": {"emoji_type": rec["emoji_type"]}}

    def _h_unreact(self, call, body, mid, rid):
        with self._lock:
            rec = next((r for r in self._reactions
                        if r["reaction_id"] == rid and r["message_id"] == mid and not r["deleted"]), None)
            if rec is None:
                raise _Reject(231003, "The reaction does not exist.")
            rec["deleted"] = True
        return self._ok(self._reaction_data(rec))

    def _h_chat(self, call, body, cid):
        p2p = cid.startswith("oc_p2p")
        mode = "p2p" if p2p else self.chat_modes.get(cid, "group")
        return self._ok({
            "chat_id": cid, "name": self.chats.get(cid, "" if p2p else f"Chat {cid}"),
            "description": "", "owner_id": "ou_alice", "owner_id_type": "open_id",
            "chat_mode": mode, "group_message_type": "thread" if mode == "topic" else "chat",
            "chat_type": "private",
            "external": False, "tenant_key": "tk_fake", "user_count": "2" if p2p else "3",
            "bot_count": "1",
        })

    # ---- contact ------------------------------------------------------------------------
    def _user(self, uid: str) -> dict:
        name = self.users.get(uid) or (uid.split("_", 1)[-1].capitalize() if uid else "")
        return {"open_id": uid, "union_id": "on_" + uid.split("_", 1)[-1], "user_id": uid.split("_", 1)[-1],
                "name": name, "en_name": name, "avatar": {"avatar_72": "https://example.invalid/a.png"}}

    def _h_user(self, call, body, uid):
        return self._ok({"user": self._user(uid)})

    def _h_users_batch(self, call, body):
        ids = parse_qs(call.query_string).get("user_ids", [])  # ?user_ids=a&user_ids=b
        return self._ok({"items": [self._user(u) for u in ids]})

    # ---- CardKit ------------------------------------------------------------------------
    def _card_text_locked(self, st: CardState) -> str:
        body = st.card.get("body") if isinstance(st.card.get("body"), dict) else st.card
        return "\n".join(_card_texts(body, st.element_texts))

    @staticmethod
    def _find_element(node: Any, element_id: str) -> dict | None:
        if isinstance(node, dict):
            if node.get("element_id") == element_id:
                return node
            for v in node.values():
                found = FakeLark._find_element(v, element_id)
                if found is not None:
                    return found
        elif isinstance(node, list):
            for v in node:
                found = FakeLark._find_element(v, element_id)
                if found is not None:
                    return found
        return None

    @staticmethod
    def _parse_card_json(type_: Any, data: Any) -> dict:
        if type_ == "template":
            return {"template": data}
        if type_ != "card_json":
            raise _Reject(10002, "Your request contains an invalid request parameter: type must be card_json or template")
        if not isinstance(data, str) or not data:
            raise _Reject(300307, "The card DSL is empty")
        try:
            card = json.loads(data)
        except ValueError:
            raise _Reject(200220, "Failed to generate card content: data is not valid JSON") from None
        if not isinstance(card, dict):
            raise _Reject(200220, "Failed to generate card content: card must be a JSON object")
        return card

    def _h_card_create(self, call, body):
        card = self._parse_card_json(body.get("type"), body.get("data"))
        with self._lock:
            card_id = str(7300000000000000000 + next(self._ids))
            streaming = bool((card.get("config") or {}).get("streaming_mode"))
            self._cards[card_id] = CardState(card_id=card_id, card=card, streaming_mode=streaming,
                                             sequence=0, element_texts={})
            if streaming:
                self._card_started[card_id] = time.monotonic()
        return self._ok({"card_id": card_id})

    def _card_op(self, card_id: str, body: dict, op: str, apply: Callable[[CardState], None]):
        """Shared CardKit checks: entity exists, uuid idempotency, strictly increasing sequence."""
        seq = body.get("sequence")
        uuid = body.get("uuid") or None
        with self._lock:
            st = self._cards.get(card_id)
            if st is None:
                raise _Reject(200740, "The card entity does not exist")
            fingerprint = json.dumps(body, sort_keys=True, ensure_ascii=False)
            if uuid is not None:
                seen = self._card_uuids.get((card_id, uuid))
                if seen is not None:
                    if seen == fingerprint:
                        return self._ok({})
                    raise _Reject(200770, "UUID conflict")
            if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= 2**31 - 1:
                raise _Reject(10002, "Your request contains an invalid request parameter: "
                              "sequence must be a positive int32")
            if seq <= st.sequence:
                raise _Reject(300317, "The sequence number for operating on the card did not "
                              f"increment consecutively (got {seq}, last {st.sequence})")
            apply(st)  # may raise _Reject; nothing is recorded then
            st.sequence = seq
            st.history.append({"op": op, "sequence": seq, "uuid": uuid, "at": time.time(),
                               **{k: v for k, v in body.items() if k not in ("sequence", "uuid")}})
            if uuid is not None:
                self._card_uuids[(card_id, uuid)] = fingerprint
        return self._ok({})

    def _streaming_open(self, st: CardState) -> bool:
        started = self._card_started.get(st.card_id)
        if st.streaming_mode and started is not None and \
                time.monotonic() - started > self.card_streaming_timeout:
            st.streaming_mode = False  # CardKit closes streaming mode by itself after 10 minutes
        return st.streaming_mode

    def _h_card_content(self, call, body, card, el):
        content = body.get("content")

        def apply(st: CardState) -> None:
            if not isinstance(content, str) or not 1 <= len(content) <= 100_000:
                raise _Reject(10002, "Your request contains an invalid request parameter: "
                              "content must be 1..100000 characters")
            if not self._streaming_open(st):
                raise _Reject(300309, "streaming mode is closed; element content can only be "
                              "streamed while config.streaming_mode is true")
            node = self._find_element(st.card, el)
            if node is None:
                raise _Reject(300301, f"element_id {el!r} not found in card")
            if node.get("tag") not in ("markdown", "plain_text", "lark_md", "div"):
                raise _Reject(300301, f"element {el!r} ({node.get('tag')}) is not a text element")
            st.element_texts[el] = content

        return self._card_op(card, body, f"content:{el}", apply)

    def _h_card_settings(self, call, body, card):
        raw = body.get("settings")

        def apply(st: CardState) -> None:
            try:
                settings = json.loads(raw) if isinstance(raw, str) else None
            except ValueError:
                settings = None
            if not isinstance(settings, dict):
                raise _Reject(10002, "Your request contains an invalid request parameter: settings "
                              "must be a JSON object string")
            config = settings.get("config") or {}
            st.card.setdefault("config", {}).update(config)
            if "streaming_mode" in config:
                st.streaming_mode = bool(config["streaming_mode"])
                if st.streaming_mode:
                    self._card_started[st.card_id] = time.monotonic()

        return self._card_op(card, body, "settings", apply)

    def _h_card_update(self, call, body, card):
        spec = body.get("card") or {}

        def apply(st: CardState) -> None:
            new = self._parse_card_json(spec.get("type"), spec.get("data"))
            st.card = new
            st.element_texts = {}
            st.streaming_mode = bool((new.get("config") or {}).get("streaming_mode"))
            if st.streaming_mode:
                self._card_started[st.card_id] = time.monotonic()

        return self._card_op(card, body, "update", apply)

    # ---- snapshots / dumps --------------------------------------------------------------
    def _snapshot(self, m: _Msg) -> SentMessage:
        try:
            current = json.loads(m.current_raw) if m.current_raw else m.content
        except ValueError:
            current = m.content
        ctype = m.current_type or m.msg_type
        if ctype == "interactive" and isinstance(current, dict) and current.get("type") == "card":
            cid = (current.get("data") or {}).get("card_id")
            st = self._cards.get(cid)
            text = self._card_text_locked(st) if st is not None else ""
        else:
            text = extract_text(ctype, current)
        return SentMessage(
            message_id=m.message_id, kind=m.kind, chat_id=m.chat_id, receive_id=m.receive_id,
            receive_id_type=m.receive_id_type, reply_to=m.reply_to,
            reply_in_thread=m.reply_in_thread, thread_id=m.thread_id, root_id=m.root_id,
            msg_type=m.msg_type, content=copy.deepcopy(m.content), text=text, uuid=m.uuid,
            at=m.at, card_id=m.card_id, current_content=copy.deepcopy(current), edits=m.edits,
            recalled=m.recalled,
        )

    def _dump(self, headline: str) -> str:
        lines = [f"FakeLark: {headline}.", "Delivered messages:"]
        msgs = self.messages()
        lines += [f"  {m.kind} {m.message_id} chat={m.chat_id} uuid={m.uuid} "
                  f"{m.msg_type}: {m.text[:120]!r}" for m in msgs] or ["  (none)"]
        lines.append("Last calls:")
        calls = self.calls[-25:]
        lines += [f"  {c.method} {c.path} -> HTTP {c.status} code {c.code}" for c in calls] or ["  (none)"]
        with self._lock:
            if self._faults:
                lines.append(f"Pending faults: {self._faults}")
            if self.internal_errors:
                lines.append("Fake internal errors:\n" + "\n".join(self.internal_errors))
        return "\n".join(lines)

    def dump(self) -> str:
        """Human-readable state (deliveries, last calls, pending faults) for debugging."""
        return self._dump("state")


# ============================================================================================
# Feishu documents (engineer `tools`, issue 26) — kept in this one section to ease rebases.
# docx raw content, wiki nodes (→ their object), sheets and their values, and denial (the
# bot has not been given access: HTTP 403 with the API's permission code).
#
#     lark.add_docx("doxcnA", "正文")            lark.add_wiki_node("wikcnB", "docx", "doxcnA")
#     lark.add_sheet("shtcnC", {"s1": ("Sheet1", [["a", 1]])})     lark.deny_doc("doxcnD")
#
# Who may read a document (issue 45 N2), as drive serves it to the tenant token: each document
# (a wiki node too, under its node token) has an owner, link sharing, external access and
# collaborators; the bot is a collaborator of every document it was given. Unset, a document is
# owned by ``ou_owner`` with link sharing closed — only its owner and the bot may read it.
#
#     lark.share_doc("doxcnA", owner="ou_alice", link="tenant_readable",
#                    members=[("openid", "ou_bob", "view"), ("openchat", "oc_team", "view")])
#
#   GET  /open-apis/drive/v2/permissions/:token/public?type=   → permission_public
#   GET  /open-apis/drive/v1/permissions/:token/members?type=  → items (collaborators)
#   POST /open-apis/drive/v1/metas/batch_query                 → metas (owner_id) / failed_list
# ``type`` must be the document's (docx, sheet, wiki; doc for an old doc): Lark answers a
# mismatch with 1063001. A denied document answers 1063002 (HTTP 403) and a meta's 970003.
# ============================================================================================

DOC_DENIED_CODES = {"docx": 1770032, "wiki": 131006, "sheets": 1310213}


def _docs(self) -> dict:
    with self._lock:
        return self.__dict__.setdefault("_docs_state", {"docx": {}, "wiki": {}, "sheets": {}, "denied": set(),
                                                        "perms": {}})


DOC_PERM_TYPES = {"docx": ("docx", "doc"), "wiki": ("wiki",), "sheets": ("sheet",)}


def _add_docx(self, token: str, text: str, **perms) -> None:
    _docs(self)["docx"][token] = text
    _share_doc(self, token, **perms)


def _add_wiki_node(self, token: str, obj_type: str, obj_token: str, title: str = "", **perms) -> None:
    _docs(self)["wiki"][token] = {"obj_type": obj_type, "obj_token": obj_token, "title": title or token}
    _share_doc(self, token, **perms)


def _add_sheet(self, token: str, sheets: dict, **perms) -> None:
    """``sheets``: sheet_id -> (title, rows of values)."""
    _docs(self)["sheets"][token] = dict(sheets)
    _share_doc(self, token, **perms)


def _share_doc(self, token: str, *, owner: str | None = None, link: str | None = None,
               external: str | None = None, members: list | None = None) -> None:
    """Set who may read ``token`` (kept fields unchanged when not given): ``owner`` an open_id,
    ``link`` the link_share_entity (closed, tenant_readable, tenant_editable,
    partner_tenant_readable, anyone_readable, …), ``external`` the external_access_entity
    (closed, open, allow_share_partner_tenant), ``members`` (member_type, member_id, perm)
    tuples besides the bot."""
    with self._lock:
        p = _docs(self)["perms"].setdefault(token, {"owner": "ou_owner", "link": "closed",
                                                    "external": "closed", "members": []})
        for key, value in (("owner", owner), ("link", link), ("external", external)):
            if value is not None:
                p[key] = value
        if members is not None:
            p["members"] = [tuple(m) for m in members]


def _perm_doc(self, call, token: str) -> dict:
    """The permission record of ``token`` for a drive permission call, checking ``type``
    against the document's kind as Lark does."""
    docs = _docs(self)
    if token in docs["denied"]:      # the bot was not given the document: it cannot tell more
        raise _Reject(1063002, "Permission denied", 403)
    kind = next((k for k in ("docx", "wiki", "sheets") if token in docs[k]), None)
    if kind is None:
        raise _Reject(1063005, "resource is deleted or does not exist", 404)
    if call.query.get("type", "") not in DOC_PERM_TYPES[kind]:
        raise _Reject(1063001, "Invalid parameter: type does not match the token", 400)
    with self._lock:
        return dict(docs["perms"].setdefault(token, {"owner": "ou_owner", "link": "closed",
                                                     "external": "closed", "members": []}))


def _h_perm_public(self, call, body, tok):
    p = _perm_doc(self, call, tok)
    return self._ok({"permission_public": {
        "external_access_entity": p["external"], "security_entity": "anyone_can_view",
        "comment_entity": "anyone_can_view", "share_entity": "anyone",
        "manage_collaborator_entity": "collaborator_can_view", "link_share_entity": p["link"],
        "copy_entity": "anyone_can_view", "lock_switch": False}})


_MEMBER_KIND = {"openid": "user", "userid": "user", "unionid": "user", "email": "user", "openchat": "chat",
                "opendepartmentid": "department", "groupid": "group", "wikispaceid": "wiki_space_member"}


def _h_perm_members(self, call, body, tok):
    p = _perm_doc(self, call, tok)
    items = [{"member_type": "openid", "member_id": self.bot_open_id, "perm": "view", "perm_type": "container",
              "type": "user"}]
    items += [{"member_type": mt, "member_id": mid, "perm": perm, "perm_type": "container",
               "type": _MEMBER_KIND.get(mt, "user")} for mt, mid, perm in p["members"]]
    return self._ok({"items": items})


def _h_metas(self, call, body):
    docs = _docs(self)
    metas, failed = [], []
    for req in (body.get("request_docs") or [])[:200]:
        tok, typ = str(req.get("doc_token", "")), str(req.get("doc_type", ""))
        kind = next((k for k in ("docx", "wiki", "sheets") if tok in docs[k]), None)
        if tok in docs["denied"]:
            failed.append({"token": tok, "code": 970003})
        elif kind is None or typ not in DOC_PERM_TYPES[kind]:
            failed.append({"token": tok, "code": 970005})
        else:
            with self._lock:
                owner = docs["perms"].get(tok, {}).get("owner", "ou_owner")
            metas.append({"doc_token": tok, "doc_type": typ, "title": tok, "owner_id": owner,
                          "create_time": "1700000000", "latest_modify_user": owner,
                          "latest_modify_time": "1700000000"})
    return self._ok({"metas": metas, "failed_list": failed})


def _deny_doc(self, token: str) -> None:
    _docs(self)["denied"].add(token)


def _doc_check(self, kind: str, token: str) -> None:
    if token in _docs(self)["denied"]:
        raise _Reject(DOC_DENIED_CODES[kind], "forbidden: the app has no permission on this document", 403)


def _h_docx_raw(self, call, body, doc):
    _doc_check(self, "docx", doc)
    text = _docs(self)["docx"].get(doc)
    if text is None:
        raise _Reject(1770002, "not found", 404)
    return self._ok({"content": text})


def _h_wiki_node(self, call, body):
    token = call.query.get("token", "")
    _doc_check(self, "wiki", token)
    node = _docs(self)["wiki"].get(token)
    if node is None:
        raise _Reject(131005, "not found: document is not in wiki", 404)
    return self._ok({"node": {"node_token": token, "space_id": "7000", **node}})


def _h_sheets_query(self, call, body, tok):
    _doc_check(self, "sheets", tok)
    sheets = _docs(self)["sheets"].get(tok)
    if sheets is None:
        raise _Reject(1310214, "spreadsheet not found", 404)
    return self._ok({"sheets": [{"sheet_id": sid, "title": t, "index": i, "resource_type": "sheet"}
                                for i, (sid, (t, _)) in enumerate(sheets.items())]})


def _h_sheet_values(self, call, body, tok, rng):
    _doc_check(self, "sheets", tok)
    sheets = _docs(self)["sheets"].get(tok) or {}
    sid = rng.split("!")[0]
    if sid not in sheets:
        raise _Reject(1310214, "sheet not found", 404)
    return self._ok({"revision": 1, "spreadsheetToken": tok,
                     "valueRange": {"majorDimension": "ROWS", "range": rng, "values": sheets[sid][1]}})


for _name, _fn in (("add_docx", _add_docx), ("add_wiki_node", _add_wiki_node), ("add_sheet", _add_sheet),
                   ("deny_doc", _deny_doc), ("_h_docx_raw", _h_docx_raw), ("_h_wiki_node", _h_wiki_node),
                   ("_h_sheets_query", _h_sheets_query), ("_h_sheet_values", _h_sheet_values),
                   ("share_doc", _share_doc), ("_h_perm_public", _h_perm_public),
                   ("_h_perm_members", _h_perm_members), ("_h_metas", _h_metas)):
    setattr(FakeLark, _name, _fn)
FakeLark._ROUTES = FakeLark._ROUTES + [
    (m, re.compile(p + r"\Z"), h, True) for (m, p, h) in [
        ("GET", r"/open-apis/docx/v1/documents/(?P<doc>[^/]+)/raw_content", "_h_docx_raw"),
        ("GET", r"/open-apis/wiki/v2/spaces/get_node", "_h_wiki_node"),
        ("GET", r"/open-apis/sheets/v3/spreadsheets/(?P<tok>[^/]+)/sheets/query", "_h_sheets_query"),
        ("GET", r"/open-apis/sheets/v2/spreadsheets/(?P<tok>[^/]+)/values/(?P<rng>[^/]+)", "_h_sheet_values"),
        ("GET", r"/open-apis/drive/v2/permissions/(?P<tok>[^/]+)/public", "_h_perm_public"),
        ("GET", r"/open-apis/drive/v1/permissions/(?P<tok>[^/]+)/members", "_h_perm_members"),
        ("POST", r"/open-apis/drive/v1/metas/batch_query", "_h_metas"),
    ]
]
