"""Long-connection transport: lark-oapi's WebSocket protocol with our lifecycle and
acknowledge-after-store, and a supervisor that never gives up.

Why not ``lark_oapi.ws.Client.start()``: the SDK takes ``asyncio.get_event_loop()`` when
``lark_oapi.ws.client`` is first imported and runs everything on that module-level loop with
``run_until_complete`` (impossible on a running loop); its endpoint discovery is blocking
``requests``; its event handler is a blocking call (an event that waits for the application
to commit it blocked the very loop it waited on: every frame answered 500 after 2.5 s); it
has no way to stop; and it gives up for good once Lark's ``ReconnectCount`` is used up or the
credentials are refused — a bot that silently stops answering until someone restarts it.

So we keep the SDK's wire protocol (through bot/lark/transport/compat.py, the one module that touches
its privates) and own the lifecycle, never touching the SDK's module ``loop``. By default the
connection is a task on the application's loop, where an event is stored and answered with no
thread to cross; ``ETHAN_WS_OWN_THREAD=true`` runs it on a "lark-ws" thread and loop of its own,
where every event crosses twice, each crossing waiting for the interpreter lock — a longer
acknowledgement tail and more CPU per event (bench/bench_ws_ack.py measures both in one run).
The SDK is imported and endpoint discovery runs on short-lived threads, so neither blocks the
loop; the endpoint is asked again before every attempt.

The supervisor is a small state machine (``TRANSITIONS``; one log line per state change, not
per attempt): ``connecting`` → ``connected``; a lost connection → ``disconnected``, retried on
the server's ``ClientConfig`` schedule (a random pause up to ``ReconnectNonce`` s, then
``ReconnectCount`` tries ``ReconnectInterval`` s apart); once those are used up, or when Lark
refuses the credentials, → ``backing_off``: tries go on forever, the pause doubling up to
``ETHAN_WS_RETRY_MAX_S``. A watchdog closes a connection on which no pong or other frame
arrived within twice the ping interval (a silent peer, a half-open TCP connection) and the
supervisor reconnects. ``/healthz`` is 503 whenever the state is not ``connected``.

Each EVENT (or CARD) frame is handed to ``Intake.accept`` (parse, commit to the inbox,
dispatch) and answered only once that returned: 200 — with the card click's toast and updated
card in the response's ``data`` when there is one — or 500 (Lark redelivers) when it failed,
took longer than ``STORE_TIMEOUT`` or the app is stopping. Frames are acknowledged
concurrently: one slow commit does not hold the frames behind it.

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

from bot.lark.transport import compat
from bot.lark.transport.routes import NotAccepting
from bot.infra.log import get_logger

log = get_logger("ethan.ws")

STORE_TIMEOUT = 2.5        # Lark wants an answer within 3 s
DISCOVERY_TIMEOUT = 30.0   # the SDK's POST has no timeout of its own
OPEN_TIMEOUT = 10.0        # WebSocket handshake
CLOSE_TIMEOUT = 2.0        # close handshake on stop / after a loss
ACK_DRAIN_S = 1.0          # on stop: let frames already being acknowledged get their answer
STOP_TIMEOUT = 5.0         # stop() never waits longer than this for the thread
RETRY_MAX_S = 120.0        # ETHAN_WS_RETRY_MAX_S: the longest pause between tries once backing off
WATCHDOG_PINGS = 2         # no pong or frame within this many ping intervals: reconnect

# Connection states (the ``state`` field of /healthz's transport and of the log lines).
STARTING, CONNECTING, CONNECTED, DISCONNECTED, BACKING_OFF, CRASHED, STOPPED = (
    "starting", "connecting", "connected", "disconnected", "backing_off", "crashed", "stopped")

# state -> (log event, level). Logged on entering the state, and when its reason changes: a try
# that fails the way the one before it did writes no line (/healthz shows ``attempts``).
STATE_EVENTS = {
    CONNECTING: ("ws.connecting", "info"),       # the first connection is being made
    CONNECTED: ("ws.connected", "info"),
    DISCONNECTED: ("ws.disconnected", "warning"),  # lost or not made; Lark's schedule runs
    BACKING_OFF: ("ws.backing_off", "warning"),  # Lark's schedule used up / credentials refused
    CRASHED: ("ws.crashed", "error"),            # a bug in this module: the thread ended
    STOPPED: ("ws.stopped", "info"),
}
TRANSITIONS = {
    STARTING: {CONNECTING, STOPPED, CRASHED},
    CONNECTING: {CONNECTED, DISCONNECTED, BACKING_OFF, STOPPED, CRASHED},
    CONNECTED: {DISCONNECTED, STOPPED, CRASHED},
    DISCONNECTED: {CONNECTED, BACKING_OFF, STOPPED, CRASHED},
    BACKING_OFF: {CONNECTED, STOPPED, CRASHED},
    CRASHED: {STOPPED},
    STOPPED: set(),
}


class _Refused(Exception):
    """The server refused this client (bad credentials, forbidden, connection limit): the
    SDK stops there; we back off and try again (the operator may fix it meanwhile)."""


def _describe(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:300]


def backoff_delays(first: float, cap: float, rng=random.random):
    """Pauses between tries once backing off: ``first`` doubling up to ``cap``, each with
    jitter (50–100 %) so that many processes of one app do not retry in step."""
    delay = max(0.1, min(first, cap))
    while True:
        yield delay * (0.5 + rng() / 2)
        delay = min(cap, delay * 2)


class LongConnection:
    """One long connection to Lark. ``start()`` returns at once; the connection comes up
    (and comes back, forever) as a task on the application's loop, or on a thread of its own
    with ``own_thread``; ``stop()`` closes it (and joins that thread)."""

    def __init__(self, *, app_id: str, app_secret: str, domain: str, intake: Any,
                 name: str = "lark-ws", retry_max_s: float = RETRY_MAX_S, own_thread: bool = False) -> None:
        self.app_id, self.app_secret, self.domain = app_id, app_secret, domain
        self.intake = intake       # anything with ``async accept(raw, body)``
        self.name = name
        self.retry_max_s = retry_max_s
        self.own_thread = own_thread
        self._task: asyncio.Task | None = None
        self._done = threading.Event()
        self.thread: threading.Thread | None = None
        self.state = STARTING
        self.reason = "not started"
        self.since = time.time()
        self.connects = 0          # successful connections so far
        self.attempts = 0          # tries since the last successful connection
        self.acks = {200: 0, 500: 0}
        self._lock = threading.Lock()
        self._app_loop: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._session = None
        self._conn = None
        self._tasks: set[asyncio.Task] = set()
        self._last_frame = 0.0     # monotonic time of the last frame received (the watchdog)

    # -- state (read from any thread) --------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self.state == CONNECTED

    def status(self) -> dict:
        with self._lock:
            return {"state": self.state, "reason": self.reason,
                    "since_s": round(time.time() - self.since, 1), "connects": self.connects,
                    "attempts": self.attempts}

    def _set(self, state: str, reason: str = "", **fields: Any) -> None:
        """Enter ``state`` (one log line). Already in it: a new reason is one line more (the
        operator sees why tries now fail), the same reason again is none (a retry loop does
        not fill the log)."""
        with self._lock:
            previous = self.state
            if state == previous:
                if not reason or reason == self.reason:
                    return
                self.reason = reason
            elif state not in TRANSITIONS[previous]:
                return                 # e.g. a late "disconnected" after stop(): stopped stays
            else:
                self.state, self.reason, self.since = state, reason, time.time()
            if state == CONNECTED:
                self.connects += 1
                self.attempts = 0
        event, level = STATE_EVENTS[state]
        if reason:
            fields["reason"] = reason
        getattr(log, level)(event, domain=self.domain, connection=self.name, previous=previous, **fields)

    # -- start / stop (application loop side) ------------------------------------------
    def start(self, app_loop: asyncio.AbstractEventLoop) -> None:
        """Called on the running application loop. The connection runs on this loop too (the
        default: no thread crossing per event) or, ``own_thread`` (``ETHAN_WS_OWN_THREAD=true``),
        on a "lark-ws" thread and loop of its own."""
        self._app_loop = app_loop
        self._stop = asyncio.Event()
        self._done = threading.Event()
        if not self.own_thread:
            self._loop = app_loop
            self._task = app_loop.create_task(self._main_on_app_loop(), name=self.name)
            return
        # Made here, run there: stop() can always reach it, even before the thread ran.
        self._loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
        self.thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Close the connection and wait for it (blocking: call it off the app loop, e.g.
        ``asyncio.to_thread``). Bounded: past ``timeout`` the task is cancelled / the thread
        (a daemon) left behind."""
        self._stopping = True
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):     # the loop already closed
            loop.call_soon_threadsafe(self._stop.set)
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("ws.stop_timeout", connection=self.name, timeout_s=timeout)
            return
        if not self._done.wait(timeout):
            log.warning("ws.stop_timeout", connection=self.name, timeout_s=timeout)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._task.cancel)

    async def _main_on_app_loop(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            self._set(STOPPED, "stopped")
            raise
        except BaseException as e:  # noqa: BLE001 — a bug here must not pass silently
            self._set(CRASHED, f"internal error: {_describe(e)}", error=_describe(e))
        finally:
            for t in list(self._tasks):
                t.cancel()
            if self._session is not None:
                self._session.close()
            self._done.set()

    # -- the lark-ws thread (own_thread) -----------------------------------------------
    def _thread_main(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._loop_error)
        try:
            loop.run_until_complete(self._run())
        except BaseException as e:  # noqa: BLE001 — a bug here must not pass silently
            self._set(CRASHED, f"internal error: {_describe(e)}", error=_describe(e))
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
                self._done.set()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        # One structured line instead of asyncio's traceback on stderr.
        exc = context.get("exception")
        log.warning("ws.loop_error", connection=self.name, message=str(context.get("message", ""))[:200],
                    error=_describe(exc) if exc else "")

    async def _run(self) -> None:
        if self._stopping:
            return
        # Imported off the application loop (the SDK takes ~2 s to import).
        session_cls = (compat.session_class() if self.thread is not None
                       else await asyncio.to_thread(compat.session_class))
        if self._stopping:
            return
        # Constructed on this loop: the SDK's fragment cache starts a cleaning task on
        # whatever loop is current, and its lock binds to the loop it is first used on.
        self._session = session_cls(self.app_id, self.app_secret, self.domain,
                                    on_frame=self._on_frame, on_ack_lost=self._ack_lost)
        await self._supervise(self._stop)
        self._set(STOPPED, "stopped")

    # -- the supervisor ----------------------------------------------------------------
    async def _supervise(self, stop: asyncio.Event) -> None:
        """Connect; while connected, serve; when lost, reconnect — first on Lark's schedule,
        then backing off — for as long as we are not stopped."""
        s = self._session
        self._set(CONNECTING, attempt=1)
        reason = await self._attempt()
        if isinstance(reason, _Refused):
            reason = await self._back_off(str(reason), stop, cause="the server refused the client")
        elif reason is not None and not stop.is_set():
            self._set(DISCONNECTED, reason, retry_in_s=f"0-{s.reconnect_nonce:g}")
            reason = await self._on_schedule(reason, stop, nonce=True)
        while not stop.is_set():
            if reason is None:
                reason = await self._serve(stop)
                if stop.is_set():
                    return
                self._set(DISCONNECTED, reason, reconnect_in_s=f"0-{s.reconnect_nonce:g}")
                reason = await self._on_schedule(reason, stop, nonce=True)
            else:
                return                              # stopped while trying

    async def _on_schedule(self, reason: str, stop: asyncio.Event, *, nonce: bool) -> str | None:
        """Lark's schedule: None once connected; anything else means stopped. Refused, or
        ``ReconnectCount`` tries used up: on to backing off."""
        s = self._session
        if nonce and s.reconnect_nonce > 0 and await self._pause(random.random() * s.reconnect_nonce, stop):
            return "stopping"
        tries = 0
        while not stop.is_set():
            if s.reconnect_count >= 0 and tries >= s.reconnect_count:
                return await self._back_off(
                    reason, stop, cause=f"no connection after {tries} reconnect attempts "
                                        f"(server's ReconnectCount={s.reconnect_count})")
            tries += 1
            got = await self._attempt()
            if got is None:
                return None
            if isinstance(got, _Refused):
                return await self._back_off(str(got), stop, cause="the server refused the client")
            reason = got
            self._set(DISCONNECTED, reason)
            if await self._pause(s.reconnect_interval, stop):
                return "stopping"
        return "stopping"

    async def _back_off(self, reason: str, stop: asyncio.Event, *, cause: str) -> str | None:
        """Try forever, the pause doubling up to ``retry_max_s``; the endpoint is discovered
        again on every try (a refused credential may have been fixed, the endpoint moved)."""
        delays = backoff_delays(self._session.reconnect_interval, self.retry_max_s)
        delay = next(delays)
        self._set(BACKING_OFF, reason, cause=cause, retry_in_s=round(delay, 1), retry_max_s=self.retry_max_s)
        while not stop.is_set():
            if await self._pause(delay, stop):
                return "stopping"
            got = await self._attempt()
            if got is None:
                return None
            self._set(BACKING_OFF, str(got))       # same state: the reason only, no line
            delay = next(delays)
        return "stopping"

    async def _attempt(self) -> str | _Refused | None:
        """One connection attempt: None when connected, else why not."""
        with self._lock:
            self.attempts += 1
        try:
            if not await self._open_unless_stopped():
                return "stopping"
        except compat.sdk_client_exception() as e:
            return _Refused(f"refused by the server: {e}")
        except Exception as e:  # noqa: BLE001 — unreachable, 5xx, handshake, timeout…
            return _describe(e)
        s = self._session
        self._last_frame = time.monotonic()
        self._set(CONNECTED, conn_id=s.conn_id, service_id=s.service_id,
                  ping_interval_s=s.ping_interval, reconnect_count=s.reconnect_count,
                  reconnect_interval_s=s.reconnect_interval)
        return None

    async def _open_unless_stopped(self) -> bool:
        # A stop must not wait for a hung discovery (up to 30 s) or handshake (10 s).
        opening = asyncio.ensure_future(self._open())
        stopping = asyncio.ensure_future(self._stop.wait())
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
        """The SDK's endpoint POST (blocking ``requests``, no timeout) on a daemon thread: it
        blocks neither loop, and a hung one cannot keep the process alive."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        session = self._session

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        def work() -> None:
            try:
                result = (True, session.discover())
            except BaseException as e:  # noqa: BLE001 — reported to the awaiting loop
                result = (False, e)
            with contextlib.suppress(RuntimeError):   # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, *result)

        threading.Thread(target=work, name=f"{self.name}-endpoint", daemon=True).start()
        try:
            return await asyncio.wait_for(fut, DISCOVERY_TIMEOUT)
        except asyncio.TimeoutError:
            raise TimeoutError(f"endpoint discovery at {self.domain} took over "
                               f"{DISCOVERY_TIMEOUT:.0f}s") from None

    async def _open(self) -> None:
        url = await self._discover()
        self._conn = await self._session.connect(url, open_timeout=OPEN_TIMEOUT, close_timeout=CLOSE_TIMEOUT)

    async def _serve(self, stop: asyncio.Event) -> str:
        """Receive, ping and watch until the connection is lost (the reason) or we stop."""
        conn = self._conn
        receiving = asyncio.ensure_future(self._receive(conn))
        pinging = asyncio.ensure_future(self._pings(conn))
        watching = asyncio.ensure_future(self._watchdog())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({receiving, watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pinging.cancel()
            stopping.cancel()
            watching_done = watching.done()
            watching.cancel()
        if receiving.done():
            reason = receiving.result()
        elif watching_done:
            reason = watching.result()
            receiving.cancel()
        else:
            reason = "stopping"
            await self.drain_acks(ACK_DRAIN_S)
            receiving.cancel()
        await self._close(conn)
        with contextlib.suppress(asyncio.CancelledError):
            await receiving
        return reason

    async def _receive(self, conn) -> str:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                msg = await conn.recv()
                self._last_frame = time.monotonic()
                self.spawn(self._session.handle(msg))
        except ConnectionClosed as e:
            return f"connection closed ({e})"[:300]
        except Exception as e:  # noqa: BLE001
            return _describe(e)

    async def _pings(self, conn) -> None:
        session = self._session
        while session.current(conn):
            try:
                await session.send(session.ping())
            except Exception as e:  # noqa: BLE001 — the receive side notices a dead connection
                log.info("ws.ping_failed", connection=self.name, error=_describe(e))
            await asyncio.sleep(max(session.ping_interval, 1))   # may change with a pong

    async def _watchdog(self) -> str:
        """Returns (so the connection is closed and made again) once no pong or other frame
        arrived within ``WATCHDOG_PINGS`` ping intervals: Lark answers every ping."""
        session = self._session
        while True:
            limit = WATCHDOG_PINGS * max(session.ping_interval, 1)
            silent = time.monotonic() - self._last_frame
            if silent > limit:
                return (f"watchdog: no pong or frame for {silent:.1f}s "
                        f"({WATCHDOG_PINGS}x the ping interval of {session.ping_interval:g}s)")
            await asyncio.sleep(min(limit - silent + 0.05, max(session.ping_interval / 4, 0.1)))

    async def _close(self, conn) -> None:
        self._session.detach()
        self._conn = None
        try:
            await asyncio.wait_for(conn.close(), CLOSE_TIMEOUT + 0.5)
        except BaseException:  # noqa: BLE001 — the peer is gone; drop the socket
            with contextlib.suppress(Exception):
                conn.transport.abort()

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain_acks(self, timeout: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    def _ack_lost(self, message_id: str, e: BaseException) -> None:
        log.info("ws.ack_lost", connection=self.name, message_id=message_id, error=_describe(e))

    # -- acknowledge-after-store (called on the lark-ws loop) --------------------------
    async def _on_frame(self, message_id: str, payload: bytes) -> tuple[int, dict | None]:
        return await self.accept(payload)

    async def accept(self, payload: bytes) -> tuple[int, dict | None]:
        """Hand one event to the application loop: the response frame's code, and the body
        Lark shows for a card click (toast, updated card) or None."""
        try:
            raw = bytes(payload).decode("utf-8")
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            # Redelivering what cannot be parsed would not make it parseable.
            log.warning("ws.invalid_payload", connection=self.name, error=_describe(e), size=len(payload))
            return self._count(200), None
        if self._app_loop is None or self._app_loop.is_closed():
            return self._count(500), None
        coro = self.intake.accept(raw, body)
        if self.thread is None:
            fut = asyncio.ensure_future(coro)     # the same loop: no thread to cross
        else:
            try:
                fut = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._app_loop))
            except RuntimeError:          # the application loop closed meanwhile
                coro.close()
                return self._count(500), None
        try:
            result = await asyncio.wait_for(fut, STORE_TIMEOUT)
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
            return self._count(500), None
        return self._count(200), getattr(result, "response", None)

    def _count(self, code: int) -> int:
        self.acks[code] = self.acks.get(code, 0) + 1
        return code


__all__ = ["LongConnection", "STORE_TIMEOUT", "CONNECTED", "CONNECTING", "DISCONNECTED",
           "BACKING_OFF", "CRASHED", "STARTING", "STOPPED", "backoff_delays"]
