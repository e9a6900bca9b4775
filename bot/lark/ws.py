"""Long-connection transport: lark-oapi's WebSocket client, with our acknowledge-after-store.

The SDK runs its client on a module-level event loop; we run that loop on its own thread
and hand each event to the application loop, waiting (briefly) until it is committed to
the inbox before returning — the SDK acknowledges the frame only after we return, and
answers 500 (so Lark redelivers) if we raise.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from bot.lark.intake import Intake
from bot.log import get_logger

log = get_logger("ethan.ws")

STORE_TIMEOUT = 2.5   # Lark wants an answer within 3 s


class StoringEventHandler:
    """Stands in for lark-oapi's EventDispatcherHandler on the long connection."""

    def __init__(self, intake: Intake, app_loop: asyncio.AbstractEventLoop) -> None:
        self.intake = intake
        self.app_loop = app_loop

    def _do_without_validation(self, payload: bytes) -> Any:
        body = json.loads(payload)
        raw = payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else str(payload)
        fut = asyncio.run_coroutine_threadsafe(self.intake.accept(raw, body), self.app_loop)
        fut.result(timeout=STORE_TIMEOUT)   # raises -> SDK answers 500 -> Lark redelivers
        return None

    # The SDK's webhook entry point; not used on the long connection.
    def do(self, req: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


class LongConnection:
    def __init__(self, *, app_id: str, app_secret: str, domain: str, intake: Intake) -> None:
        self.app_id, self.app_secret, self.domain = app_id, app_secret, domain
        self.intake = intake
        self.thread: threading.Thread | None = None
        self._client = None

    @property
    def is_connected(self) -> bool:
        return self._client is not None and getattr(self._client, "_conn", None) is not None

    def start(self, app_loop: asyncio.AbstractEventLoop) -> None:
        import lark_oapi as lark
        from lark_oapi.ws import client as ws_module

        handler = StoringEventHandler(self.intake, app_loop)
        self._client = lark.ws.Client(self.app_id, self.app_secret, event_handler=handler,
                                      domain=self.domain, log_level=lark.LogLevel.WARNING)
        ws_loop = ws_module.loop

        def run() -> None:
            asyncio.set_event_loop(ws_loop)
            try:
                self._client.start()
            except Exception as e:  # noqa: BLE001 — includes the loop being stopped on shutdown
                log.info("ws.stopped", error=str(e)[:300])

        self.thread = threading.Thread(target=run, name="lark-ws", daemon=True)
        self.thread.start()
        log.info("ws.started", domain=self.domain)

    def stop(self) -> None:
        from lark_oapi.ws import client as ws_module

        ws_loop = ws_module.loop
        if self._client is not None and ws_loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._client._disconnect(), ws_loop)
            try:
                fut.result(timeout=3)
            except Exception:  # noqa: BLE001
                pass
            ws_loop.call_soon_threadsafe(ws_loop.stop)
