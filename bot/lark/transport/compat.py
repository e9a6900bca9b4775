"""The one module that touches lark-oapi's private long-connection API (issue 28).

``bot/lark/transport/ws.py`` owns the lifecycle of a long connection (its thread and loop, reconnects,
the watchdog, acknowledge-after-store) and keeps the SDK's wire protocol: endpoint discovery
with its headers, error codes and ``ClientConfig``; the handshake's error headers; ping frames;
fragment reassembly; control frames and pong-borne configuration; the response frame. The SDK
offers none of that publicly, so every private member it is reached through is named here and
nowhere else — and ``tests/lark/test_lark_compat.py`` checks that each still exists with the
shape used below, on the lark-oapi installed, which must be inside :data:`TESTED` (the pin in
pyproject.toml). An SDK release that renames or reshapes one fails that test, not a user's bot.

If that test fails after an upgrade: read lark_oapi/ws/client.py, adapt this module (the only
one that needs to change), then widen ``TESTED`` and the pin together.

Importing the SDK takes ~2 s: :func:`session_class` defines the class on first use, on the
long connection's own thread.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Awaitable, Callable

TESTED = ">=1.7.5,<1.8"

# Every private member of lark_oapi.ws.client used here (the compat test walks these lists).
CLIENT_PRIVATE_METHODS = ("_get_conn_url", "_handle_message", "_handle_control_frame",
                          "_handle_data_frame", "_write_message", "_combine", "_configure")
CLIENT_PRIVATE_ATTRS = ("_conn", "_conn_url", "_conn_id", "_service_id", "_domain",
                        "_connection_host", "_connection_headers", "_lock", "_cache",
                        "_reconnect_nonce", "_reconnect_count", "_reconnect_interval", "_ping_interval")
MODULE_PRIVATES = ("_get_by_key", "_new_ping_frame", "_ws_connect_kwargs", "_parse_ws_conn_exception")

# What a frame handler returns: the response code, and the body Lark shows for a card click
# (``{"toast": …, "card": …}``) or None.
FrameHandler = Callable[[str, bytes], Awaitable[tuple[int, dict | None]]]

_SESSION_CLASS = None


def sdk_client_exception() -> type[BaseException]:
    """The SDK's "do not retry as is" error (bad credentials, forbidden, connection limit)."""
    from lark_oapi.ws.exception import ClientException
    return ClientException


def session_class():
    """``lark_oapi.ws.Client`` with a small public surface of our own (defined lazily)."""
    global _SESSION_CLASS
    if _SESSION_CLASS is not None:
        return _SESSION_CLASS

    from urllib.parse import parse_qs, urlparse

    import websockets
    from lark_oapi.core.enum import LogLevel
    from lark_oapi.core.json import JSON
    from lark_oapi.ws import client as sdk
    from lark_oapi.ws.const import (DEVICE_ID, HEADER_BIZ_RT, HEADER_MESSAGE_ID, HEADER_SEQ,
                                    HEADER_SUM, HEADER_TYPE, SERVICE_ID)
    from lark_oapi.ws.model import Response
    from websockets.exceptions import InvalidHandshake

    from bot.infra.log import adopt_library_handlers
    adopt_library_handlers("Lark")     # the SDK prints its own raw lines to stdout: JSON via the root instead

    class SdkSession(sdk.Client):
        """One app's client: discovery, handshake, frames. Never uses the SDK's module loop."""

        def __init__(self, app_id: str, app_secret: str, domain: str, on_frame: FrameHandler,
                     on_ack_lost: Callable[[str, BaseException], None]) -> None:
            super().__init__(app_id, app_secret, log_level=LogLevel.WARNING, event_handler=None,
                             domain=domain, auto_reconnect=False)
            self.on_frame = on_frame
            self.on_ack_lost = on_ack_lost

        # -- the server's ClientConfig (from discovery, updated by pongs) -----------------
        @property
        def ping_interval(self) -> float:
            return float(self._ping_interval)

        @property
        def reconnect_count(self) -> int:
            return int(self._reconnect_count)

        @property
        def reconnect_interval(self) -> float:
            return float(self._reconnect_interval)

        @property
        def reconnect_nonce(self) -> float:
            return float(self._reconnect_nonce)

        @property
        def conn_id(self) -> str:
            return self._conn_id

        @property
        def service_id(self) -> str:
            return self._service_id

        @property
        def domain(self) -> str:
            return self._domain

        # -- connecting -------------------------------------------------------------------
        def discover(self) -> str:
            """The endpoint POST (blocking ``requests``, no timeout of its own: run it on a
            thread). Applies the ClientConfig it carries; raises the SDK's Client/Server
            exceptions as the SDK does."""
            return sdk.build_connection_url(self._get_conn_url(), self._connection_host)

        async def connect(self, conn_url: str, *, open_timeout: float, close_timeout: float):
            """The WebSocket handshake to a discovered URL; the connection becomes current."""
            q = parse_qs(urlparse(conn_url).query)
            conn_id, service_id = q[DEVICE_ID][0], q[SERVICE_ID][0]
            try:
                conn = await websockets.connect(conn_url, open_timeout=open_timeout,
                                                close_timeout=close_timeout,
                                                **sdk._ws_connect_kwargs(self._connection_headers))
            except InvalidHandshake as e:
                sdk._parse_ws_conn_exception(e)    # raises the SDK's Client/ServerException
                raise
            self._conn, self._conn_url, self._conn_id, self._service_id = conn, conn_url, conn_id, service_id
            return conn

        def detach(self) -> None:
            """Forget the current connection (the caller closes it). Not the SDK's
            ``_disconnect``: cancelled while waiting for its lock, it releases a lock it does
            not hold."""
            self._conn = None
            self._conn_url = self._conn_id = self._service_id = ""

        def close(self) -> None:
            """Stop the fragment cache's cleaning task (made on the loop current at
            construction; left running, it outlives the connection on a shared loop)."""
            cron = getattr(self._cache, "_cron", None)
            if cron is not None:
                cron.cancel()

        def current(self, conn) -> bool:
            return self._conn is conn

        # -- frames -----------------------------------------------------------------------
        async def send(self, data: bytes) -> None:
            await self._write_message(data)

        def ping(self) -> bytes:
            return sdk._new_ping_frame(int(self._service_id)).SerializeToString()

        async def handle(self, msg: bytes) -> None:
            """One received frame: control frames (pong → ClientConfig) as the SDK does, data
            frames through :meth:`_handle_data_frame` below."""
            await self._handle_message(msg)

        async def _handle_data_frame(self, frame) -> None:
            # The SDK's, except that the handler is awaited (on the app loop) rather than run
            # as a blocking call on this loop, and CARD frames are not dropped unanswered.
            hs = frame.headers
            msg_id = sdk._get_by_key(hs, HEADER_MESSAGE_ID)
            sum_, seq = int(sdk._get_by_key(hs, HEADER_SUM)), int(sdk._get_by_key(hs, HEADER_SEQ))
            type_ = sdk._get_by_key(hs, HEADER_TYPE)
            payload = frame.payload
            if sum_ > 1:
                payload = self._combine(msg_id, sum_, seq, payload)
                if payload is None:
                    return            # more fragments to come; the last one is answered
            if type_ not in ("event", "card"):
                return
            start = time.monotonic()
            code, body = await self.on_frame(msg_id, payload)
            header = hs.add()
            header.key = HEADER_BIZ_RT
            header.value = str(int((time.monotonic() - start) * 1000))
            frame.payload = response_payload(code, body, JSON, Response)
            try:
                await self._write_message(frame.SerializeToString())
            except Exception as e:  # noqa: BLE001 — lost with the connection; Lark redelivers
                self.on_ack_lost(msg_id, e)

    _SESSION_CLASS = SdkSession
    return SdkSession


def response_payload(code: int, body: dict | None, JSON: Any, Response: Any) -> bytes:
    """The response frame's payload as the SDK writes it: ``Response(code, data)`` where data is
    base64 of the handler's JSON result (a card click's toast and card) — Lark shows it."""
    resp = Response(code=code)
    if body is not None:
        resp.data = base64.b64encode(json.dumps(body, ensure_ascii=False).encode("utf-8"))
    return JSON.marshal(resp).encode("utf-8")
