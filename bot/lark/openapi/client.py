"""The Lark Open API over one long-lived ``aiohttp.ClientSession``.

Why not ``lark_oapi.Client``: its async transport opens a new ``httpx.AsyncClient``
(a new TLS context) for every call — DESIGN §5 measured 80 % of a reply's CPU
there — and its token manager fetches tokens with blocking ``requests`` calls on
the event loop. Here one pooled session carries every call (connection reuse, one
TLS context), and the tenant access token is fetched asynchronously, once for any
number of concurrent callers, and cached until ~5 minutes before it expires.

Why aiohttp rather than a pooled ``httpx.AsyncClient``: aiohttp is already here (the
server), and its client costs about a third of httpx's CPU per call on the event loop
(bench/README.md, "End-to-end throughput"). The session is created lazily inside the
running loop on the first call and closed by ``aclose()``. What httpx did implicitly is
kept explicitly: CA bundle from ``SSL_CERT_FILE``/``SSL_CERT_DIR`` or certifi, proxy from
``HTTPS_PROXY``/``NO_PROXY`` (read once, not per request), bool query values as
``true``/``false``, no silent resend of a request whose connection was reset (aiohttp
resends GET/PUT/DELETE once; a reset is the caller's TRANSIENT error, as before).

Request bodies follow the shapes of lark-oapi's generated models
(``ReplyMessageRequestBody``, ``ContentCardElementRequestBody``, …) as plain dicts;
tests check the field names against those models.

Errors become ``LarkApiError`` with the Lark code, HTTP status, the ``x-tt-logid``
log id and any server-given retry delay, plus a ``category`` from one table
(``CODE_CATEGORIES``) that callers turn into a retry decision (``DECISIONS``).
Secrets and tokens are never logged.
"""

from __future__ import annotations

import asyncio
import email.utils
import json as jsonlib
import os
import ssl
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping

import aiohttp
import structlog

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
BOT_INFO_PATH = "/open-apis/bot/v3/info"

LOG_ID_HEADER = "x-tt-logid"
RATELIMIT_RESET_HEADER = "x-ogw-ratelimit-reset"
USER_AGENT = "ethan-lark-bot"
MAX_CONNECTIONS = 64
KEEPALIVE_S = 60.0

_JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}


class Category(str, Enum):
    """What a failed Open API call means for the caller."""

    RATE_LIMITED = "rate_limited"  # wait (server hint or backoff), resend with the same uuid
    TRANSIENT = "transient"        # network, 5xx, Open API down: backoff, same uuid
    TOKEN = "token"                # access token invalid/expired: refresh once, retry once
    GONE = "gone"                  # reply target recalled/deleted: send fresh to the chat
    PERMISSION = "permission"      # scopes, bot not in chat, user blocked the bot: give up
    BAD_REQUEST = "bad_request"    # our request is wrong (content, size, ids): give up
    UNKNOWN = "unknown"            # unlisted code: give up (retrying blind could double)


@dataclass(frozen=True)
class Decision:
    retry: bool                 # resend the same request (same uuid) after a delay
    honour_retry_after: bool    # wait what the server said (x-ogw-ratelimit-reset / Retry-After)
    refresh_token: bool         # done inside OpenApi.request: refresh once, retry once
    fresh_send: bool            # a reply whose target is gone becomes a new message in the chat


DECISIONS: dict[Category, Decision] = {
    Category.RATE_LIMITED: Decision(retry=True, honour_retry_after=True, refresh_token=False, fresh_send=False),
    Category.TRANSIENT: Decision(retry=True, honour_retry_after=True, refresh_token=False, fresh_send=False),
    # OpenApi.request already refreshed and retried once; a second rejection is not transient.
    Category.TOKEN: Decision(retry=False, honour_retry_after=False, refresh_token=True, fresh_send=False),
    Category.GONE: Decision(retry=False, honour_retry_after=False, refresh_token=False, fresh_send=True),
    Category.PERMISSION: Decision(retry=False, honour_retry_after=False, refresh_token=False, fresh_send=False),
    Category.BAD_REQUEST: Decision(retry=False, honour_retry_after=False, refresh_token=False, fresh_send=False),
    Category.UNKNOWN: Decision(retry=False, honour_retry_after=False, refresh_token=False, fresh_send=False),
}

# Lark business codes. Sources: the Open Platform's error-code pages for
# im/v1/message create/reply, message reactions, the auth endpoints and the
# rate-limit page; lark_oapi/channel/errors.py (whose classification of
# 99991400 and 230020 we deliberately override, DESIGN §5).
CODE_CATEGORIES: dict[int, Category] = {
    # --- rate limits -----------------------------------------------------------------
    99991400: Category.RATE_LIMITED,  # "request trigger frequency limit" (+ x-ogw-ratelimit-reset)
    99991402: Category.RATE_LIMITED,  # listed as backpressure by lark-oapi
    230020: Category.RATE_LIMITED,    # "This operation triggers the frequency limit" (5 QPS per chat)
    11020: Category.RATE_LIMITED,     # older "too many requests" codes (lark-oapi)
    11021: Category.RATE_LIMITED,
    # --- access token ----------------------------------------------------------------
    99991661: Category.TOKEN,         # missing / malformed access token
    99991663: Category.TOKEN,         # tenant access token invalid or expired
    99991664: Category.TOKEN,         # app access token invalid
    99991665: Category.TOKEN,
    99991668: Category.TOKEN,         # access token invalid / expired
    99991671: Category.TOKEN,         # token format error
    # --- transient server side ---------------------------------------------------------
    2200: Category.TRANSIENT,         # "Internal Error" (im/v1)
    # --- the message we reply to is gone ------------------------------------------------
    230011: Category.GONE,            # the message was recalled
    231003: Category.GONE,            # the message was not found (deleted)
    230019: Category.GONE,            # the topic (thread) does not exist
    # --- permission / configuration ----------------------------------------------------
    99991401: Category.PERMISSION,    # IP denied by the tenant's allow list
    99991672: Category.PERMISSION,    # app lacks the API scope
    99991679: Category.PERMISSION,
    99991680: Category.PERMISSION,
    99991681: Category.PERMISSION,
    10003: Category.PERMISSION,       # token endpoint: invalid app_id / params
    10014: Category.PERMISSION,       # token endpoint: app secret invalid
    230002: Category.PERMISSION,      # the bot is not in the group
    230006: Category.PERMISSION,      # bot ability not activated
    230013: Category.PERMISSION,      # the user is outside the bot's availability
    230027: Category.PERMISSION,      # lack of necessary permissions
    230035: Category.PERMISSION,      # sending messages is not allowed here
    230053: Category.PERMISSION,      # the user stopped the bot from sending messages
    # --- our request is wrong ------------------------------------------------------------
    230001: Category.BAD_REQUEST,     # invalid request parameter (content shape, ids)
    230025: Category.BAD_REQUEST,     # message content too long
    230099: Category.BAD_REQUEST,     # failed to create card content
    9499: Category.BAD_REQUEST,       # bad request (generic)
    99992402: Category.BAD_REQUEST,   # field validation failed
    # --- CardKit (the caller falls back to a plain-text answer) --------------------------
    10002: Category.BAD_REQUEST,      # invalid parameter (sequence, content length, settings)
    200220: Category.BAD_REQUEST,     # failed to generate card content (bad card JSON)
    200740: Category.BAD_REQUEST,     # card entity does not exist
    200770: Category.BAD_REQUEST,     # uuid reused with a different body
    300301: Category.BAD_REQUEST,     # element_id not found / not a text element
    300307: Category.BAD_REQUEST,     # card DSL empty
    300309: Category.BAD_REQUEST,     # streaming mode already closed (it closes itself after 10 min)
    300317: Category.BAD_REQUEST,     # sequence did not increase
}

# Codes that say "no Lark code at all" (network failure, non-JSON body).
NO_CODE = -1


def classify(code: int, http_status: int | None) -> Category:
    """Map a Lark code and HTTP status to a ``Category``; the code wins when known."""
    if code in CODE_CATEGORIES:
        return CODE_CATEGORIES[code]
    if http_status == 429:
        return Category.RATE_LIMITED
    if code == NO_CODE and http_status is None:
        return Category.TRANSIENT  # network error, timeout, connection refused
    if http_status is not None and http_status >= 500:
        return Category.TRANSIENT
    if http_status in (408, 502, 503, 504):
        return Category.TRANSIENT
    if http_status in (401,):
        return Category.TOKEN
    if http_status in (403,):
        return Category.PERMISSION
    if http_status == 400 and code == NO_CODE:
        return Category.BAD_REQUEST
    return Category.UNKNOWN


class LarkApiError(Exception):
    """A failed Open API call: Lark code, HTTP status, log id, retry hint, path."""

    def __init__(
        self,
        code: int,
        msg: str = "",
        *,
        http_status: int | None = None,
        log_id: str | None = None,
        retry_after_s: float | None = None,
        path: str = "",
    ) -> None:
        self.code = int(code)
        self.msg = msg
        self.http_status = http_status
        self.log_id = log_id
        self.retry_after_s = retry_after_s
        self.path = path
        self.category = classify(self.code, http_status)
        super().__init__(
            f"Lark API {path or '?'} failed: code={self.code} http={http_status} "
            f"category={self.category.value} log_id={log_id} msg={msg}"
        )

    @property
    def decision(self) -> Decision:
        return DECISIONS[self.category]

    @property
    def transient(self) -> bool:
        return self.category in (Category.TRANSIENT, Category.RATE_LIMITED)

    def log_fields(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "http_status": self.http_status,
            "category": self.category.value,
            "log_id": self.log_id,
            "path": self.path,
            "msg": self.msg[:200],
        }


@dataclass(frozen=True)
class BotInfo:
    open_id: str
    app_name: str


def _retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from ``x-ogw-ratelimit-reset`` or ``Retry-After`` (seconds or HTTP date)."""
    for name in (RATELIMIT_RESET_HEADER, "retry-after"):
        raw = headers.get(name)
        if raw is None or not str(raw).strip():
            continue
        raw = str(raw).strip()
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            continue
        if when is not None:
            return max(0.0, when.timestamp() - now())
    return None


def _ssl_context() -> ssl.SSLContext:
    """The CA bundle httpx used: ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, else certifi's."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    try:
        import certifi
    except ImportError:  # pragma: no cover - certifi comes with lark-oapi (requests, httpx)
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


def _env_proxy(url: str) -> str | None:
    """``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY`` for ``url`` unless ``NO_PROXY`` exempts it.

    Read once per session: aiohttp's ``trust_env`` would look it up in a thread per request.
    """
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def _query(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Query pairs encoded as httpx did: bools as true/false, None as "", lists repeated."""
    def text(v: Any) -> str:
        if v is True:
            return "true"
        if v is False:
            return "false"
        return "" if v is None else str(v)

    out: list[tuple[str, str]] = []
    for k, v in params.items():
        for item in v if isinstance(v, (list, tuple)) else (v,):
            out.append((str(k), text(item)))
    return out


class OpenApi:
    """Tenant-token authenticated JSON calls to the Lark Open API."""

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        domain: str = "https://open.feishu.cn",
        *,
        http: aiohttp.ClientSession | None = None,
        timeout: float = 10.0,
        token_margin_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        log=None,
    ) -> None:
        self._app_id = app_id
        self._app_secret = app_secret
        self.domain = domain.rstrip("/")
        self._own_http = http is None
        self._http: aiohttp.ClientSession | None = http  # owned: created on first use, in the loop
        self._closed = False
        # total for the whole call (connect, send, answer); connect includes waiting for a pooled slot
        self._client_timeout = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5.0))
        self._timeout = timeout
        self._token_margin_s = token_margin_s
        self._clock = clock
        self._log = log or structlog.get_logger("ethan.lark")
        self._token: str | None = None
        self._token_expires = 0.0
        self._token_lock = asyncio.Lock()
        self.token_fetches = 0  # observable for tests and metrics

    @property
    def http(self) -> aiohttp.ClientSession:
        """The session every call goes over (created here on first use; needs a running loop)."""
        session = self._http
        if session is None:
            if self._closed:
                raise RuntimeError("OpenApi is closed")
            session = self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S,
                    ssl=_ssl_context() if self.domain.startswith("https:") else True),
                timeout=self._client_timeout,
                headers={"User-Agent": USER_AGENT},
                proxy=_env_proxy(self.domain),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            # aiohttp resends an idempotent request once when its connection is reset. A
            # CardKit PUT or a reaction DELETE may have been applied before the reset; the
            # caller's retry table decides (same uuid / next sequence), not the transport.
            if hasattr(session, "_retry_connection"):
                session._retry_connection = False
        return session

    async def aclose(self) -> None:
        self._closed = True
        if self._own_http and self._http is not None:
            session, self._http = self._http, None
            await session.close()

    async def __aenter__(self) -> "OpenApi":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ---- token ---------------------------------------------------------------------------
    async def tenant_token(self, *, force: bool = False, rejected: str | None = None) -> str:
        """The cached tenant access token; one fetch serves all concurrent callers.

        ``force`` with ``rejected`` (the token the server refused) refreshes unless
        another caller already replaced that token meanwhile.
        """
        if not force and self._token and self._clock() < self._token_expires:
            return self._token
        async with self._token_lock:
            fresh = self._token is not None and self._clock() < self._token_expires
            if fresh and (not force or self._token != rejected):
                return self._token  # type: ignore[return-value]
            return await self._fetch_token()

    def invalidate_token(self) -> None:
        self._token = None
        self._token_expires = 0.0

    async def _fetch_token(self) -> str:
        self.token_fetches += 1
        body = await self._send(
            "POST", TOKEN_PATH, json={"app_id": self._app_id, "app_secret": self._app_secret}, token=None
        )
        token = body.get("tenant_access_token")
        if not token:
            raise LarkApiError(NO_CODE, "token response without tenant_access_token", http_status=200, path=TOKEN_PATH)
        expire = float(body.get("expire") or 0)
        # Refresh ~5 minutes early; for very short lifetimes (tests) refresh at half-life.
        ttl = expire - self._token_margin_s if expire > 2 * self._token_margin_s else expire / 2
        self._token = str(token)
        self._token_expires = self._clock() + max(ttl, 0.0)
        self._log.debug("lark.token.fetched", expires_in_s=expire)
        return self._token

    # ---- requests ------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> dict:
        """Call ``path``; return the body's ``data`` (or the whole body when it has none).

        Raises ``LarkApiError``. A rejected token is refreshed once and the call
        retried once; every other failure is the caller's to decide.
        """
        token = await self.tenant_token()
        try:
            body = await self._send(method, path, json=json, params=params, token=token)
        except LarkApiError as e:
            if e.category is not Category.TOKEN:
                raise
            self._log.info("lark.token.rejected", code=e.code, path=path, log_id=e.log_id)
            token = await self.tenant_token(force=True, rejected=token)
            body = await self._send(method, path, json=json, params=params, token=token)
        data = body.get("data")
        return data if isinstance(data, dict) else body

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        token: str | None,
    ) -> dict:
        headers = _JSON_HEADERS if token is None else {**_JSON_HEADERS, "Authorization": f"Bearer {token}"}
        data = None if json is None else jsonlib.dumps(
            json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        session = self.http
        try:
            async with session.request(
                method, self.domain + path, data=data, params=_query(params) if params else None,
                headers=headers, timeout=self._client_timeout,
            ) as resp:
                raw = await resp.read()
                status = resp.status
                resp_headers = resp.headers
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # timeouts, refused, resets
            raise LarkApiError(NO_CODE, f"{type(e).__name__}: {e}", path=path) from e
        log_id = resp_headers.get(LOG_ID_HEADER)
        try:
            body = jsonlib.loads(raw)  # whatever the content type says, as httpx's .json() did
        except ValueError:  # includes UnicodeDecodeError
            body = None
        if not isinstance(body, dict):
            raise LarkApiError(
                NO_CODE,
                f"non-JSON response ({resp_headers.get('content-type', '?')})",
                http_status=status,
                log_id=log_id,
                retry_after_s=_retry_after(resp_headers),
                path=path,
            )
        code = body.get("code", NO_CODE if status >= 400 else 0)
        try:
            code = int(code)
        except (TypeError, ValueError):
            code = NO_CODE
        if code != 0 or status >= 400:
            err = body.get("error") if isinstance(body.get("error"), dict) else {}
            raise LarkApiError(
                code,
                str(body.get("msg") or ""),
                http_status=status,
                log_id=log_id or err.get("log_id"),
                retry_after_s=_retry_after(resp_headers),
                path=path,
            )
        return body

    # ---- helpers -------------------------------------------------------------------------
    async def bot_info(self) -> BotInfo:
        """The bot's own identity (``GET /open-apis/bot/v3/info``)."""
        body = await self.request("GET", BOT_INFO_PATH)
        bot = body.get("bot") if isinstance(body.get("bot"), dict) else body
        open_id = str(bot.get("open_id") or "")
        if not open_id:
            raise LarkApiError(NO_CODE, "bot info without open_id", http_status=200, path=BOT_INFO_PATH)
        return BotInfo(open_id=open_id, app_name=str(bot.get("app_name") or ""))

    async def download(self, message_id: str, key: str, *, kind: str, max_bytes: int) -> tuple[bytes, str]:
        """A message's image or file (``GET /open-apis/im/v1/messages/{id}/resources/{key}
        ?type=image|file``): its bytes and content type. Read in chunks and abandoned past
        ``max_bytes`` (``ResourceTooLarge``), so an oversized upload never sits in memory whole.
        Errors come back as JSON (``LarkApiError``, e.g. 234003 key not in message, 99991672
        missing a scope: im:message:readonly)."""
        path = f"/open-apis/im/v1/messages/{urllib.parse.quote(message_id, safe='')}/resources/{urllib.parse.quote(key, safe='')}"
        for attempt in (1, 2):
            token = await self.tenant_token(force=attempt == 2)
            try:
                async with self.http.request(
                    "GET", self.domain + path, params=[("type", kind)],
                    headers={"Authorization": f"Bearer {token}"}, timeout=self._client_timeout,
                ) as resp:
                    ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                    if resp.status == 200 and ctype != "application/json":
                        length = resp.content_length
                        if length is not None and length > max_bytes:
                            raise ResourceTooLarge(length)
                        chunks, size = [], 0
                        async for chunk in resp.content.iter_chunked(64 * 1024):
                            size += len(chunk)
                            if size > max_bytes:
                                raise ResourceTooLarge(size)
                            chunks.append(chunk)
                        return b"".join(chunks), ctype
                    raw = await resp.read()
                    status, headers = resp.status, resp.headers
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                raise LarkApiError(NO_CODE, f"{type(e).__name__}: {e}", path=path) from e
            try:
                body = jsonlib.loads(raw)
            except ValueError:
                body = None
            body = body if isinstance(body, dict) else {}
            try:
                code = int(body.get("code", NO_CODE))
            except (TypeError, ValueError):
                code = NO_CODE
            err = LarkApiError(code, str(body.get("msg") or f"HTTP {status}"), http_status=status,
                               log_id=headers.get(LOG_ID_HEADER), retry_after_s=_retry_after(headers),
                               path=path)
            if err.category is Category.TOKEN and attempt == 1:
                continue
            raise err
        raise AssertionError("unreachable")


class ResourceTooLarge(Exception):
    """A downloaded resource passed its size cap (bytes seen so far, or the declared length)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"resource larger than the cap ({size} bytes seen)")
        self.size = size
