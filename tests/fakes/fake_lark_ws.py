"""A fake Lark long-connection server, at the wire, for the real ``lark_oapi.ws.Client``.

Two halves, as in Lark:

- **Endpoint discovery** ``POST <LARK_DOMAIN>/callback/ws/endpoint`` (``{"AppID", "AppSecret"}``)
  → ``{"code": 0, "data": {"URL": "ws://…?device_id=…&service_id=…", "ClientConfig": {…}}}``.
  Served by the fake Open API (:class:`~tests.fakes.fake_lark.FakeLark`) this object plugs
  into, so the client discovers its endpoint at the same ``LARK_DOMAIN`` the app uses — and
  FakeLark's knobs (``set_down``, ``fail_next("/callback/ws/endpoint", …)``) apply to it.
- **The WebSocket** (its own aiohttp server, own thread and loop: lark-oapi's discovery is
  blocking ``requests``): binary frames of lark-oapi's own protobuf (``pbbp2_pb2.Frame``).
  The client's ping (CONTROL, ``type=ping``) is answered with a pong carrying ClientConfig.
  :meth:`push` sends an event as DATA frames (``type=event``, ``message_id``, ``trace_id``,
  ``sum``, ``seq``), whole or in fragments; the client's response frames are recorded as
  :class:`Ack` (code, seconds from the last fragment sent to the response received).

Knobs: ``client_config`` (what discovery and pongs announce), ``refuse_connections``
(handshake answered 503 — the endpoint still answers), :meth:`drop` (close every connection
from the server side, cleanly or by resetting the socket), :meth:`go_silent` (the open
connections stay open but get no pong and no frame any more, as a half-open TCP connection or a
stuck gateway: only a watchdog notices), ``app_id``/``app_secret`` (when set, discovery with
other credentials gets a client error: the SDK does not retry those; set them back to ``None``
to accept again).

A response frame's ``data`` (base64 of JSON: a card click's ``{"toast", "card"}``, as the SDK
writes it) is decoded into :attr:`Ack.data`.

Card clicks (``card.action.trigger``) arrive in ``type=event`` frames on the real long
connection, like any event: :meth:`push` sends them so by default (``msg_type="card"`` is the
SDK's other data type, which lark-oapi's own client drops).

Several connections may be open at once (several processes of one app): :meth:`push` sends
each event to one of them, like Lark.

    with FakeLark() as lark, FakeLarkWs(lark) as ws:
        ... start ``ethan serve`` with LARK_DOMAIN=lark.base_url, LARK_TRANSPORT=ws
        ws.wait_connected()
        mid = ws.push(make_text_event("hi", chat_id="oc_p2p"))
        ack = ws.wait_ack(mid)          # Ack(code=200, seconds=0.004, ...)
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from lark_oapi.ws.pb.pbbp2_pb2 import Frame
from tests.fakes.fake_lark import FakeLark, ThreadedAiohttpServer

__all__ = ["Ack", "FakeLarkWs", "WsConnection", "FAST_CONFIG"]

CONTROL, DATA = 0, 1
SERVICE_ID = 7
# Tests want reconnects in about a second, not Lark's 2 minutes (+ up to 30 s of jitter).
FAST_CONFIG = {"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 1, "PingInterval": 2}


@dataclass
class Ack:
    message_id: str          # the frame's message_id header (one per push)
    code: int | None         # the client's Response.code (200 stored, 500 redeliver)
    seconds: float           # last fragment sent → response frame received
    headers: dict[str, str]
    connection: int
    at: float = field(default_factory=time.monotonic)
    data: dict | None = None  # the decoded ``data`` of the response (a card click's toast and card)


@dataclass
class WsConnection:
    id: int
    device_id: str
    opened_at: float
    ws: web.WebSocketResponse | None = None
    closed_at: float | None = None
    pings: int = 0
    close_reason: str = ""
    silent: bool = False      # go_silent(): pings unanswered, nothing pushed

    @property
    def open(self) -> bool:
        return self.closed_at is None


class FakeLarkWs(ThreadedAiohttpServer):
    def __init__(self, lark: FakeLark | None = None, *, client_config: dict | None = None,
                 app_id: str | None = None, app_secret: str | None = None) -> None:
        super().__init__()
        self.lark = lark
        self.client_config = dict(FAST_CONFIG if client_config is None else client_config)
        self.app_id, self.app_secret = app_id, app_secret
        self.refuse_connections = False
        self.pong_config = True         # pongs carry ClientConfig (as Lark's do)
        self._lock = threading.RLock()
        self._conns: list[WsConnection] = []
        self._acks: list[Ack] = []
        self._sent: dict[str, float] = {}      # message_id -> monotonic time of the last fragment
        self._discoveries: list[dict] = []
        self._ids = itertools.count(1)
        self._rr = itertools.count()
        self._changed = threading.Condition(self._lock)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 10.0):
        super().start(timeout)
        if self.lark is not None:
            self.lark.ws = self
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.lark is not None and getattr(self.lark, "ws", None) is self:
            self.lark.ws = None
        super().stop(timeout)

    # -- endpoint discovery (called by FakeLark on its own thread) ----------------------
    def endpoint(self, body: dict) -> tuple[int, dict, dict]:
        with self._lock:
            self._discoveries.append(dict(body))
        if self.app_id is not None and body.get("AppID") != self.app_id:
            return 200, {"code": 1000040344, "msg": "app not found"}, {}
        if self.app_secret is not None and body.get("AppSecret") != self.app_secret:
            return 200, {"code": 1000040351, "msg": "app secret invalid"}, {}
        n = next(self._ids)
        url = (f"ws://{self.host}:{self.port}/ws/v2?fpid=9&aid=1&device_id=dev{n}"
               f"&access_key=ak{n}&service_id={SERVICE_ID}&ticket=tk{n}")
        return 200, {"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": dict(self.client_config)}}, {}

    # -- inspection (thread-safe snapshots) ---------------------------------------------
    @property
    def discoveries(self) -> list[dict]:
        with self._lock:
            return list(self._discoveries)

    def connections(self, *, open_only: bool = False) -> list[WsConnection]:
        with self._lock:
            return [c for c in self._conns if c.open or not open_only]

    def acks(self, message_id: str | None = None) -> list[Ack]:
        with self._lock:
            return [a for a in self._acks if message_id is None or a.message_id == message_id]

    @property
    def pings(self) -> int:
        with self._lock:
            return sum(c.pings for c in self._conns)

    def wait_connected(self, n: int = 1, timeout: float = 20.0) -> list[WsConnection]:
        """Until ``n`` connections are open (sync)."""
        return self._wait(lambda: (len(o := self.connections(open_only=True)) >= n) and o, timeout,
                          f"{n} open connection(s)")

    def wait_connections_total(self, n: int, timeout: float = 20.0) -> list[WsConnection]:
        """Until ``n`` connections were ever accepted and one is open (reconnects)."""
        return self._wait(lambda: len(self.connections()) >= n and self.connections(open_only=True)
                          and self.connections(), timeout, f"{n} connections in all")

    def wait_ack(self, message_id: str, timeout: float = 10.0) -> Ack:
        [ack] = self._wait(lambda: self.acks(message_id)[:1], timeout, f"the response to {message_id}")
        return ack

    def wait_acks(self, n: int, timeout: float = 30.0) -> list[Ack]:
        return self._wait(lambda: len(a := self.acks()) >= n and a, timeout, f"{n} response frames")

    async def wait_connected_async(self, n: int = 1, timeout: float = 20.0):
        return await asyncio.to_thread(self.wait_connected, n, timeout)

    async def wait_ack_async(self, message_id: str, timeout: float = 10.0) -> Ack:
        return await asyncio.to_thread(self.wait_ack, message_id, timeout)

    def _wait(self, predicate, timeout: float, what: str):
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                got = predicate()
                if got:
                    return got
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"fake ws: timed out after {timeout}s waiting for {what}; "
                                         f"connections={self.connections()} acks={len(self._acks)}")
                self._changed.wait(min(left, 0.1))

    # -- commands (from any thread) -----------------------------------------------------
    def push(self, event: dict | bytes, *, fragments: int = 1, message_id: str | None = None,
             connection: WsConnection | None = None, msg_type: str = "event",
             timeout: float = 5.0) -> str:
        """Send one event as ``fragments`` DATA frames to one open connection; returns the
        frame message_id the response will carry. Blocks until written."""
        fut = self.push_nowait(event, fragments=fragments, message_id=message_id,
                               connection=connection, msg_type=msg_type)
        return fut.result(timeout)

    def push_nowait(self, event: dict | bytes, *, fragments: int = 1, message_id: str | None = None,
                    connection: WsConnection | None = None, msg_type: str = "event"):
        """Like :meth:`push`; returns a concurrent Future of the message_id (for load)."""
        payload = event if isinstance(event, bytes) else json.dumps(event, ensure_ascii=False).encode()
        mid = message_id or f"ws_msg_{next(self._ids)}"
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(
            self._push(payload, fragments, mid, connection, msg_type), self._loop)

    def go_silent(self) -> int:
        """The open connections stay open, but nothing answers their pings any more (and
        nothing is pushed to them); connections made afterwards behave. Returns how many."""
        with self._lock:
            conns = [c for c in self._conns if c.open]
            for c in conns:
                c.silent = True
        return len(conns)

    def drop(self, *, mode: str = "close", timeout: float = 5.0) -> int:
        """Drop every open connection: ``close`` (a close frame, 1001 going away) or
        ``reset`` (the socket aborted, no close frame). Returns how many were dropped."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._drop(mode), self._loop).result(timeout)

    # -- server side --------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ws/v2", self._ws)
        return app

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_connections:
            return web.Response(status=503, text="busy")
        ws = web.WebSocketResponse(autoping=True, heartbeat=None)
        await ws.prepare(request)
        with self._changed:
            conn = WsConnection(id=len(self._conns) + 1, device_id=request.query.get("device_id", ""),
                                opened_at=time.monotonic(), ws=ws)
            self._conns.append(conn)
            self._changed.notify_all()
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    self._on_frame(conn, msg.data)
        finally:
            with self._changed:
                conn.closed_at = time.monotonic()
                conn.close_reason = conn.close_reason or f"client closed ({ws.close_code})"
                conn.ws = None
                self._changed.notify_all()
        return ws

    def _on_frame(self, conn: WsConnection, data: bytes) -> None:
        now = time.monotonic()
        frame = Frame()
        frame.ParseFromString(data)
        headers = {h.key: h.value for h in frame.headers}
        if frame.method == CONTROL and headers.get("type") == "ping":
            with self._lock:
                conn.pings += 1
            if conn.silent:
                return
            pong = self._frame(CONTROL, {"type": "pong"}, json.dumps(self.client_config).encode()
                               if self.pong_config else b"")
            asyncio.get_running_loop().create_task(self._send(conn, pong))
            return
        if frame.method == DATA:
            mid = headers.get("message_id", "")
            code, data = None, None
            try:
                resp = json.loads(frame.payload or b"{}")
                code = resp.get("code")
                if resp.get("data"):
                    data = json.loads(base64.b64decode(resp["data"]))
            except ValueError:
                pass
            with self._changed:
                sent = self._sent.get(mid, now)
                self._acks.append(Ack(mid, code, now - sent, headers, conn.id, now, data))
                self._changed.notify_all()

    @staticmethod
    def _frame(method: int, headers: dict[str, str], payload: bytes) -> Frame:
        frame = Frame()
        frame.SeqID, frame.LogID, frame.service, frame.method = 0, 0, SERVICE_ID, method
        for k, v in headers.items():
            h = frame.headers.add()
            h.key, h.value = k, str(v)
        frame.payload = payload
        return frame

    async def _send(self, conn: WsConnection, frame: Frame) -> None:
        ws = conn.ws
        if ws is not None and not ws.closed:
            try:
                await ws.send_bytes(frame.SerializeToString())
            except (ConnectionError, RuntimeError):
                pass

    def _pick(self, connection: WsConnection | None) -> WsConnection:
        if connection is not None:
            return connection
        open_ = [c for c in self.connections(open_only=True) if not c.silent]
        if not open_:
            raise RuntimeError("fake ws: no open connection to push to")
        return open_[next(self._rr) % len(open_)]

    async def _push(self, payload: bytes, fragments: int, mid: str, connection, msg_type: str) -> str:
        conn = self._pick(connection)
        n = max(1, fragments)
        size = -(-len(payload) // n)
        parts = [payload[i * size:(i + 1) * size] for i in range(n)]
        trace = f"trace_{mid}"
        for seq, part in enumerate(parts):
            frame = self._frame(DATA, {"type": msg_type, "message_id": mid, "trace_id": trace,
                                       "sum": n, "seq": seq}, part)
            if conn.ws is None:
                raise RuntimeError("fake ws: the connection closed while pushing")
            if seq == n - 1:    # before the write: the answer may be read before it returns
                with self._lock:
                    self._sent[mid] = time.monotonic()
            await conn.ws.send_bytes(frame.SerializeToString())
        return mid

    async def _drop(self, mode: str) -> int:
        dropped = 0
        for conn in self.connections(open_only=True):
            ws = conn.ws
            if ws is None:
                continue
            conn.close_reason = f"dropped by the server ({mode})"
            dropped += 1
            if mode == "reset":
                transport = ws._req.transport if ws._req is not None else None  # noqa: SLF001
                if transport is not None:
                    transport.abort()
            else:
                await ws.close(code=1001, message=b"going away")
        return dropped
