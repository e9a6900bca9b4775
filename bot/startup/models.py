"""Start-up steps of the outbound clients: ``models`` (the chat, fallback and consolidation
models, built once the port is open: the offline model is served on it), ``model check`` (a
wrong key, an unknown model, an unreachable endpoint: one line and a degraded /healthz), and
``clients``, which starts nothing and, at shutdown, closes the clients later steps made (Lark's,
the models', speech to text's) after the port and before the database. Apart because these are
the app's connections out, made lazily and closed together.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bot.infra.log import get_logger
from bot.llm import build_models
from bot.startup.lifespan import Boot, Shutdown
from bot.startup.web import OFFLINE_PATH

log = get_logger("ethan.app")


async def build_model_clients(app: Any, boot: Boot) -> None:
    s = app.settings
    app.models = build_models(s, offline_base_url=app.base_url + OFFLINE_PATH,
                              offline_api_key=app.auth.offline_key,   # the offline route answers this process only
                              on_response=app._on_model_response,
                              on_fallback=app._on_fallback)
    boot.model = app.models.chat


async def close_clients(app: Any, shutdown: Shutdown) -> None:
    if app.lark_api is not None:
        await app.lark_api.aclose()
    if app.models is not None:
        await app.models.aclose()
    if app.stt is not None:
        with contextlib.suppress(Exception):
            await app.stt.aclose()


async def check_model(app: Any, boot: Boot) -> None:
    for line in app.settings.model_warnings():
        log.warning("config.model_mismatch", problem=line)
    from bot.infra.config.names import unknown_names

    # a misspelt name was ignored in silence and its default used (ETHAN_MODLE, OPENAI_BASEURL)
    for name, closest in unknown_names(app.settings):
        log.warning("config.unknown_setting", name=name, closest=closest,
                    problem=f"{name} is not a setting and is ignored" + (f"; did you mean {closest}?" if closest else ""))
    await _check_model(app)


async def _check_model(app: Any) -> None:
    """Wrong key, unknown model, unreachable endpoint: one line naming the setting and a
    degraded /healthz, not an apology to every user forever. The process keeps serving
    (the console shows the problem); a later successful answer clears it."""
    if app.settings.offline_model or app.models is None:
        app.model_problem = ""
        return
    from bot.llm.health import check_models

    # Every configured model (main, fallbacks, consolidation): a fallback or consolidation
    # model without a key would otherwise fail only when it is needed.
    app.model_problem = await check_models(app.settings, app.models)
    if app.model_problem:
        log.error("model.unusable", problem=app.model_problem)
