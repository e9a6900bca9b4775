"""Start-up step ``web server``: one aiohttp server for health and metrics, Lark's webhook,
the built-in offline model and the console; the port opens here (before the models: the
offline model is served on it). Apart because it is the app's only listening socket and its
settings (header and lingering timeouts) are read here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from bot.lark.transport.routes import make_handler
from bot.startup.lifespan import Boot, Shutdown

OFFLINE_PATH = "/_offline"
HEADER_TIMEOUT_S = 15.0    # an idle connection, or one whose request head is unfinished, is closed


async def start_web_server(app: Any, boot: Boot) -> None:
    from bot.offline.server import setup_offline_model
    from bot.web.console import ConsoleDeps, setup_console
    from bot.web.errors import quiet_malformed_requests
    from bot.web.health import setup_health

    s = app.settings
    quiet_malformed_requests()
    setup_health(app.web, app)
    if s.lark_enabled and s.lark_transport == "webhook":
        # Load the cipher now, off the loop: the first requests after a restart (Lark's
        # redeliveries) must be acknowledged within 3 s like any other.
        import importlib

        await asyncio.to_thread(importlib.import_module, "Crypto.Cipher.AES")
        handler = make_handler(app._intake_proxy(), encrypt_key=s.lark_encrypt_key,
                               verification_token=s.lark_verification_token,
                               on_refused=lambda r: app.metrics.refused.labels(reason=r).inc())
        app.web.router.add_post("/lark/events", handler)
    if s.offline_model:
        setup_offline_model(app.web, OFFLINE_PATH)
    setup_console(app.web, ConsoleDeps(
        memory=lambda: app.memory, conversations=app.conversations, bot_open_id=app.bot_open_id,
        auth=app.auth, offline_model=s.offline_model, model_problem=lambda: app.model_problem,
        is_admin=s.is_admin))
    # keepalive_timeout also bounds a connection that never completes its request head
    # (aiohttp arms it at connect; data arriving does not re-arm it); body reads have their
    # own deadline (bot/web/auth.py read_body_within, bot/lark/transport/routes.py). Lingering after
    # an early answer is kept short so refused half-bodies do not hold sockets.
    app._runner = web.AppRunner(app.web, access_log=None, handle_signals=False,
                                shutdown_timeout=2.0, keepalive_timeout=HEADER_TIMEOUT_S,
                                lingering_time=2.0)
    await app._runner.setup()
    app._site = web.TCPSite(app._runner, s.ethan_host, s.ethan_port, reuse_address=True)
    await app._site.start()
    sockets = getattr(app._site._server, "sockets", None) or []
    if sockets:
        app.port = sockets[0].getsockname()[1]


async def close_web_server(app: Any, shutdown: Shutdown) -> None:
    if app._runner is not None:
        await app._runner.cleanup()
