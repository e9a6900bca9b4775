"""Long-connection transport: lark-oapi's WebSocket client on a thread and loop of its own,
with our acknowledge-after-store.

Why not ``lark_oapi.ws.Client.start()``: the SDK takes ``asyncio.get_event_loop()`` when
``lark_oapi.ws.client`` is first imported and runs everything on that module-level loop.
Imported inside the running application loop, that loop *is* Ethan's: ``start()`` then
calls ``run_until_complete`` on a running loop, endpoint discovery (blocking ``requests``)
stalls the application, and an event handler that waits for the application loop to commit
the event blocks the very loop it waits on (every frame answered 500 after 2.5 s). The SDK
also has no way to stop.

So we keep the SDK's wire protocol — endpoint discovery (``_get_conn_url``, with its
headers, error codes and ``ClientConfig``), the protobuf frames (``pbbp2_pb2.Frame``),
fragment reassembly (``_combine``), control frames and pong-borne configuration
(``_handle_control_frame`` / ``_configure``), ping frames, handshake errors — and own the
lifecycle: a subclass of ``lark_oapi.ws.Client`` constructed and run on a loop created for
it on the "lark-ws" thread, never touching the SDK's module ``loop`` (so it does not matter
who imported the SDK when, nor how many connections a process holds). Endpoint discovery
runs on a short-lived daemon thread so it blocks neither loop; the reconnect schedule
follows the server's ``ClientConfig`` (nonce, interval, count) like the SDK's ``_reconnect``.

Each EVENT frame is handed to the application loop (``Intake.accept``: parse, commit to the
inbox, dispatch) and answered 200 only once that returned; 500 (Lark redelivers) when it
failed, took longer than ``STORE_TIMEOUT`` or the app is stopping. Frames are acknowledged
concurrently: one slow commit does not hold the frames behind it, nor the pings.

Lark delivers each event to one of an app's connections; several processes (or several
``LongConnection`` objects) may hold one each. Nothing here is process-wide: deduplication
is the inbox's (event_id, message_id), not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from typing import Any

from bot.lark.routes import NotAccepting
from bot.log import get_logger

log = get_logger("ethan.ws")

STORE_TIMEOUT = 2.5        # Lark wants an answer within 3 s
DISCOVERY_TIMEOUT = 30.0   # the SDK's POST has no timeout of its own
OPEN_TIMEOUT = 10.0        # WebSocket handshake
CLOSE_TIMEOUT = 2.0        # close handshake on stop / after a loss
ACK_DRAIN_S = 1.0          # on stop: let frames already being acknowledged get their answer
STOP_TIMEOUT = 5.0         # stop() never waits longer than this for the thread

# Connection states (the ``state`` field of /healthz's transport and of the log lines).
STARTING, CONNECTING, CONNECTED, DISCONNECTED, GAVE_UP, STOPPED = (
    "starting", "connecting", "connected", "disconnected", "gave_up", "stopped")


class _GiveUp(Exception):
    """The server said not to retry (bad credentials, forbidden, connection limit)."""


def _describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:300]


class LongConnection:
    """One long connection to Lark. ``start()`` returns at once; the connection comes up
    (and comes back) on its own thread; ``stop()`` closes it and joins the thread."""

    def __init__(self, *, app_id: str, app_secret: str, domain: str, intake: Any,
                 name: str = "lark-ws") -> None:
        self.app_id, self.app_secret, self.domain = app_id, app_secret, domain
        self.intake = intake       # anything with ``async accept(raw, body)``
        self.name = name
        self.thread: threading.Thread | None = None
        self.state = STARTING
        self.reason = "not started"
        self.since = time.time()
        self.connects = 0          # successful connections so far
        self.acks = {200: 0, 500: 0}
        self._lock = threading.Lock()
        self._app_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._client = None
        self._tasks: set[asyncio.Task] = set()

    # -- state (read from any thread) --------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self.state == CONNECTED

    def status(self) -> dict:
        with self._lock:
            return {"state": self.state, "reason": self.reason,
                    "since_s": round(time.time() - self.since, 1), "connects": self.connects}

    def _set(self, state: str, reason: str = "", **fields: Any) -> None:
        with self._lock:
            self.state, self.reason, self.since = state, reason, time.time()
            if state == CONNECTED:
                self.connects += 1
        event = {CONNECTING: "ws.connecting", CONNECTED: "ws.connected",
                 DISCONNECTED: "ws.disconnected", GAVE_UP: "ws.giving_up",
                 STOPPED: "ws.stopped"}[state]
        if reason:
            fields["reason"] = reason
        level = log.warning if state in (DISCONNECTED, GAVE_UP) else log.info
        level(event, domain=self.domain, connection=self.name, **fields)

    # -- start / stop (application loop side) ------------------------------------------
    def start(self, app_loop: asyncio.AbstractEventLoop) -> None:
        self._app_loop = app_loop
        # Made here, run there: stop() can always reach it, even before the thread ran.
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self.thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
        self.thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Close the connection and join the thread (blocking; call it off the app loop).
        Bounded: a thread that does not end in ``timeout`` is a daemon and left behind."""
        self._stopping = True
        loop, thread = self._loop, self.thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):     # the loop already closed
            loop.call_soon_threadsafe(self._stop.set)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("ws.stop_timeout", connection=self.name, timeout_s=timeout)

    # -- the lark-ws thread ------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._loop_error)
        try:
            loop.run_until_complete(self._run())
        except BaseException as e:  # noqa: BLE001 — a bug here must not pass silently
            log.error("ws.crashed", connection=self.name, error=_describe(e))
            self._set(GAVE_UP, f"internal error: {_describe(e)}")
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        # One structured line instead of asyncio's traceback on stderr.
        exc = context.get("exception")
        log.warning("ws.loop_error", connection=self.name, message=str(context.get("message", ""))[:200],
                    error=_describe(exc) if exc else "")

    async def _run(self) -> None:
        if self._stopping:
            return
        # Imported here, off the application loop (the SDK takes ~2 s to import).
        client_cls = _sdk_client_class()
        # Constructed on this loop: the SDK's fragment cache starts a cleaning task on
        # whatever loop is current, and its lock binds to the loop it is first used on.
        self._client = client_cls(self)
        try:
            await self._client.supervise(self._stop)
        except _GiveUp as e:
            self._set(GAVE_UP, str(e))
            await self._stop.wait()
            return
        if self.state != GAVE_UP:
            self._set(STOPPED, "stopped")

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain_acks(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    # -- acknowledge-after-store (called on the lark-ws loop) --------------------------
    async def accept(self, payload: bytes) -> int:
        """Hand one event to the application loop; the status code for the response frame."""
        try:
            raw = bytes(payload).decode("utf-8")
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            # Redelivering what cannot be parsed would not make it parseable.
            log.warning("ws.invalid_payload", connection=self.name, error=_describe(e), size=len(payload))
            return self._count(200)
        if self._app_loop is None or self._app_loop.is_closed():
            return self._count(500)
        coro = self.intake.accept(raw, body)
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._app_loop)
        except RuntimeError:          # the application loop closed meanwhile
            coro.close()
            return self._count(500)
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), STORE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 — not stored: 500, Lark delivers it again
            fut.cancel()
            header = body.get("header") if isinstance(body.get("header"), dict) else {}
            if isinstance(e, NotAccepting):
                log.info("ws.refused", connection=self.name, event_id=header.get("event_id"),
                         reason="stopping")
            else:
                log.warning("ws.store_failed", connection=self.name, event_id=header.get("event_id"),
                            error=_describe(e) if not isinstance(e, asyncio.TimeoutError)
                            else f"not stored within {STORE_TIMEOUT}s")
            return self._count(500)
        return self._count(200)

    def _count(self, code: int) -> int:
        self.acks[code] = self.acks.get(code, 0) + 1
        return code


_CLIENT_CLASS = None


def _sdk_client_class():
    """lark_oapi.ws.Client with our lifecycle (defined lazily: importing the SDK is slow)."""
    global _CLIENT_CLASS
    if _CLIENT_CLASS is not None:
        return _CLIENT_CLASS

    from urllib.parse import parse_qs, urlparse

    import websockets
    from lark_oapi.core.enum import LogLevel
    from lark_oapi.core.json import JSON
    from lark_oapi.ws import client as sdk
    from lark_oapi.ws.const import (DEVICE_ID, HEADER_BIZ_RT, HEADER_MESSAGE_ID, HEADER_SEQ,
                                    HEADER_SUM, HEADER_TYPE, SERVICE_ID)
    from lark_oapi.ws.enum import MessageType
    from lark_oapi.ws.exception import ClientException
    from lark_oapi.ws.model import Response
    from websockets.exceptions import ConnectionClosed, InvalidHandshake

    class EthanWsClient(sdk.Client):
        def __init__(self, owner: LongConnection) -> None:
            super().__init__(owner.app_id, owner.app_secret, log_level=LogLevel.WARNING,
                             event_handler=None, domain=owner.domain, auto_reconnect=True)
            self.owner = owner

        # -- lifecycle --------------------------------------------------------------
        async def supervise(self, stop: asyncio.Event) -> None:
            """Connect; while connected, serve; when lost, reconnect like the SDK's
            ``_reconnect`` (first a random pause up to ``ReconnectNonce`` s, then up to
            ``ReconnectCount`` tries — forever when negative — ``ReconnectInterval`` s
            apart), for as long as we are not stopped."""
            self._stop_event = stop
            reason = await self._attempt(1)
            while not stop.is_set():
                if reason is None:
                    reason = await self._serve(stop)
                    if stop.is_set():
                        return
                    self.owner._set(DISCONNECTED, reason, reconnect_in_s=f"0-{self._reconnect_nonce}")
                if self._reconnect_nonce > 0 and await self._pause(random.random() * self._reconnect_nonce, stop):
                    return
                tries = 0
                while True:
                    if self._reconnect_count >= 0 and tries >= self._reconnect_count:
                        raise _GiveUp(f"{reason}; no connection after {tries} reconnect attempts "
                                      f"(server's ReconnectCount={self._reconnect_count})")
                    tries += 1
                    reason = await self._attempt(tries, retry_in_s=self._reconnect_interval)
                    if reason is None:
                        break
                    if await self._pause(self._reconnect_interval, stop):
                        return

        async def _attempt(self, attempt: int, retry_in_s: float | None = None) -> str | None:
            """One connection attempt: None when connected, else why not (already logged)."""
            self.owner._set(CONNECTING, attempt=attempt)
            try:
                if not await self._open_unless_stopped():
                    return "stopping"
            except ClientException as e:
                raise _GiveUp(f"refused by the server: {e}") from None
            except Exception as e:  # noqa: BLE001 — unreachable, 5xx, handshake, timeout…
                reason = _describe(e)
                self.owner._set(DISCONNECTED, reason, attempt=attempt,
                                retry_in_s=retry_in_s if retry_in_s is not None
                                else f"0-{self._reconnect_nonce}")
                return reason
            self.owner._set(CONNECTED, conn_id=self._conn_id, service_id=self._service_id,
                            ping_interval_s=self._ping_interval, reconnect_count=self._reconnect_count,
                            reconnect_interval_s=self._reconnect_interval)
            return None

        async def _open_unless_stopped(self) -> bool:
            # A stop must not wait for a hung discovery (up to 30 s) or handshake (10 s).
            opening = asyncio.ensure_future(self._open())
            stopping = asyncio.ensure_future(self._stop_event.wait())
            try:
                await asyncio.wait({opening, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if not opening.done():
                opening.cancel()
                with contextlib.suppress(BaseException):
                    await opening
                return False
            opening.result()          # raises why it failed
            return True

        async def _pause(self, seconds: float, stop: asyncio.Event) -> bool:
            """Sleep up to ``seconds``; True when stopped meanwhile."""
            if stop.is_set():
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(seconds, 0))
            return stop.is_set()

        async def _discover(self) -> str:
            """The SDK's endpoint POST (blocking ``requests``, no timeout) on a daemon
            thread: it blocks neither loop, and a hung one cannot keep the process alive."""
            loop = asyncio.get_running_loop()
            fut: asyncio.Future = loop.create_future()

            def settle(ok: bool, value: Any) -> None:
                if not fut.done():
                    fut.set_result(value) if ok else fut.set_exception(value)

            def work() -> None:
                try:
                    result = (True, self._get_conn_url())
                except BaseException as e:  # noqa: BLE001 — reported to the awaiting loop
                    result = (False, e)
                with contextlib.suppress(RuntimeError):   # the loop closed meanwhile
                    loop.call_soon_threadsafe(settle, *result)

            threading.Thread(target=work, name=f"{self.owner.name}-endpoint", daemon=True).start()
            try:
                return await asyncio.wait_for(fut, DISCOVERY_TIMEOUT)
            except asyncio.TimeoutError:
                raise TimeoutError(f"endpoint discovery at {self._domain} took over "
                                   f"{DISCOVERY_TIMEOUT:.0f}s") from None

        async def _open(self) -> None:
            # The SDK's _connect, minus the module loop and the blocking call on this loop.
            conn_url = sdk.build_connection_url(await self._discover(), self._connection_host)
            q = parse_qs(urlparse(conn_url).query)
            conn_id, service_id = q[DEVICE_ID][0], q[SERVICE_ID][0]
            try:
                conn = await websockets.connect(conn_url, open_timeout=OPEN_TIMEOUT,
                                                close_timeout=CLOSE_TIMEOUT,
                                                **sdk._ws_connect_kwargs(self._connection_headers))
            except InvalidHandshake as e:
                sdk._parse_ws_conn_exception(e)    # raises the SDK's Client/ServerException
                raise
            self._conn, self._conn_url, self._conn_id, self._service_id = conn, conn_url, conn_id, service_id

        async def _serve(self, stop: asyncio.Event) -> str:
            """Receive and ping until the connection is lost (the reason) or we stop."""
            conn = self._conn
            receiving = asyncio.ensure_future(self._receive(conn))
            pinging = asyncio.ensure_future(self._pings(conn))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                pinging.cancel()
                stopping.cancel()
            if receiving.done():
                reason = receiving.result()
            else:
                reason = "stopping"
                await self.owner.drain_acks(ACK_DRAIN_S)
                receiving.cancel()
            await self._close(conn)
            with contextlib.suppress(asyncio.CancelledError):
                await receiving
            return reason

        async def _receive(self, conn) -> str:
            try:
                while True:
                    msg = await conn.recv()
                    self.owner.spawn(self._handle_message(msg))
            except ConnectionClosed as e:
                return f"connection closed ({e})"[:300]
            except Exception as e:  # noqa: BLE001
                return _describe(e)

        async def _pings(self, conn) -> None:
            while self._conn is conn:
                try:
                    await self._write_message(sdk._new_ping_frame(int(self._service_id)).SerializeToString())
                except Exception as e:  # noqa: BLE001 — the receive side notices a dead connection
                    log.info("ws.ping_failed", connection=self.owner.name, error=_describe(e))
                await asyncio.sleep(max(self._ping_interval, 1))   # may change with a pong

        async def _close(self, conn) -> None:
            # Not the SDK's _disconnect: cancelled while waiting for its lock, it releases a
            # lock it does not hold.
            self._conn = None
            self._conn_url = self._conn_id = self._service_id = ""
            try:
                await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT + 0.5)
            except BaseException:  # noqa: BLE001 — the peer is gone; drop the socket
                with contextlib.suppress(Exception):
                    conn.transport.abort()

        # -- frames -----------------------------------------------------------------
        async def _handle_data_frame(self, frame) -> None:
            # The SDK's, except that the event is awaited (on the app loop) rather than
            # handled by a blocking call on this loop.
            hs = frame.headers
            msg_id = sdk._get_by_key(hs, HEADER_MESSAGE_ID)
            sum_, seq = int(sdk._get_by_key(hs, HEADER_SUM)), int(sdk._get_by_key(hs, HEADER_SEQ))
            type_ = sdk._get_by_key(hs, HEADER_TYPE)
            payload = frame.payload
            if sum_ > 1:
                payload = self._combine(msg_id, sum_, seq, payload)
                if payload is None:
                    return            # more fragments to come; the last one is answered
            if MessageType(type_) not in (MessageType.EVENT, MessageType.CARD):
                return
            # CARD frames carry card callbacks (card.action.trigger, a schema 2.0 event like any
            # other); lark-oapi 1.7.5's client drops them unanswered, so a button clicked over
            # the long connection did nothing. They go through the same registry and inbox.
            start = time.monotonic()
            code = await self.owner.accept(payload)
            header = hs.add()
            header.key = HEADER_BIZ_RT
            header.value = str(int((time.monotonic() - start) * 1000))
            frame.payload = JSON.marshal(Response(code=code)).encode("utf-8")
            try:
                await self._write_message(frame.SerializeToString())
            except Exception as e:  # noqa: BLE001 — lost with the connection; Lark redelivers
                log.info("ws.ack_lost", connection=self.owner.name, message_id=msg_id, error=_describe(e))

    _CLIENT_CLASS = EthanWsClient
    return EthanWsClient


__all__ = ["LongConnection", "STORE_TIMEOUT", "CONNECTED", "CONNECTING", "DISCONNECTED",
           "GAVE_UP", "STARTING", "STOPPED"]
