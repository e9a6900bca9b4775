"""Start-up steps of the message path: ``outbox`` (sent cards and texts, and the handler's
dependencies), ``lark client`` (Lark's OpenAPI client, the sender, names), ``message path``
(chat events, attachments and their parse pool, speech to text, the handler, the dispatcher,
the intake — stopping it drains the replies and ends the parse workers) and ``lark transport``
(the bot's identity, the long connection — stopping it is the first thing shutdown does: no
new intake). Apart because this is the path a message takes, wired in the order it is used.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bot.core.handler import HandlerDeps, MessageHandler
from bot.core.inflight import InFlight
from bot.delivery.dispatcher import Dispatcher
from bot.delivery.outbox_store import Outbox
from bot.lark.card_clicks import CardClicks
from bot.lark.intake import Intake
from bot.lark.lifecycle import LarkDecoder
from bot.lark.openapi.names import CachedNames
from bot.startup.lifespan import Boot, Shutdown
from memory.models import caps


async def start_outbox(app: Any, boot: Boot) -> None:
    s, redelivery = app.settings, app.redelivery
    app.outbox = Outbox(app.db)
    boot.deps = HandlerDeps(
        inbox=app.inbox, agent=app.agent, commands=app.commands,
        decode=LarkDecoder(app.bot_open_id), make_reply=app._make_reply, bot_open_id=app.bot_open_id, is_admin=s.is_admin,
        respond_to_all=s.ethan_respond_to_all, names=None,
        on_ignored=lambda reason: app.metrics.ignored.labels(reason=reason).inc(),
        on_replied=app._on_replied, retry_later=redelivery.retry_later,
    )


async def start_lark_client(app: Any, boot: Boot) -> None:
    s, deps = app.settings, boot.deps
    if s.lark_enabled:
        from bot.lark.openapi.client import OpenApi
        from bot.lark.outbound import LarkSender

        # One pooled aiohttp session, owned by OpenApi: made in this loop on the first call,
        # closed by lark_api.aclose() in stop().
        app.lark_api = OpenApi(s.lark_app_id, s.lark_app_secret, s.lark_domain, timeout=10.0)
        app.sender = app.redelivery.sender = LarkSender(app.lark_api)
    app.zones.api = app.lark_api
    # Group speakers' names: looked up in Lark when connected (the console names its own).
    app.names = deps.names = CachedNames(app.lark_api)


async def start_message_path(app: Any, boot: Boot) -> None:
    s, deps, redelivery = app.settings, boot.deps, app.redelivery
    # Lark beyond text: the registry's other events, and attachments (issue 20).
    # The adapter translates (bot/lark/events.py, lifecycle.py), the core decides (bot/core/lifecycle.py).
    from bot.lark.lifecycle import LarkActions
    from bot.core.lifecycle import Lifecycle, LifecycleDeps

    deps.events = Lifecycle(LifecycleDeps(
        db=app.db, finish=app.inbox.finish, run_command=app.commands.run,
        actions=LarkActions(app.sender, app.lark_api) if app.sender is not None else None,
        recall_replies=s.ethan_recall_replies, confirm_ttl_s=s.ethan_confirm_card_minutes * 60))
    if app.lark_api is not None:
        from bot.lark.openapi.resources import LarkFetcher

        deps.fetch = LarkFetcher(app.lark_api, app.names)
    from bot.media.parse_pool import ParseLimits, ParsePool

    app.parse_pool = deps.parse_pool = ParsePool(ParseLimits(
        workers=s.ethan_parse_workers, cpu_seconds=s.ethan_parse_cpu_seconds,
        timeout=s.ethan_parse_timeout, memory_mb=s.ethan_parse_memory_mb))
    deps.vision = lambda: caps(getattr(app.agent.model, "name", "")).vision
    if app.lark_api is not None:
        from bot.lark.openapi.quoted import LarkQuotes

        deps.quote = LarkQuotes(app.lark_api, app.names, vision=deps.vision, pool=app.parse_pool)
        from bot.lark.openapi.chats import CachedChatModes
        from bot.lark.openapi.discussion import LarkDiscussion

        deps.discussion = LarkDiscussion(app.lark_api, app.names,
                                         budget_tokens=s.ethan_group_context_tokens)

        deps.decode = LarkDecoder(app.bot_open_id, CachedChatModes(app.lark_api).is_topic_chat)
    from bot.media.stt import from_settings as speech_to_text

    app.stt = deps.stt = speech_to_text(s)
    deps.last_words = app.memory.sessions.last_user_text
    app.inflight = deps.inflight = InFlight()
    app.handler = redelivery.handler = MessageHandler(deps)
    app.dispatcher = redelivery.dispatcher = Dispatcher(redelivery.handle, max_concurrency=s.ethan_max_concurrency,
                                                        admit=app._admit,
                                                        on_idle=app.replicas.on_idle if app.replicas is not None else None)
    app.intake = Intake(app.inbox, app.dispatcher,
                        on_event=lambda status: app.metrics.events.labels(status=status).inc(),
                        on_recall=app._on_recall,
                        on_tool_click=app.confirmations.click,
                        on_card_click=CardClicks(app.db, ttl_s=s.ethan_confirm_card_minutes * 60).decide)


async def drain_messages(app: Any, shutdown: Shutdown) -> None:
    if app.dispatcher is not None:
        shutdown.cancelled = await app.dispatcher.stop(shutdown.deadline)
    if app.parse_pool is not None:       # after the replies: none is parsing any more
        await app.parse_pool.stop()


async def start_lark_transport(app: Any, boot: Boot) -> None:
    s = app.settings
    if s.lark_enabled:
        app._spawn(app._resolve_identity(), "identity")
        if s.lark_transport == "ws":
            from bot.lark.transport.ws import LongConnection

            # Through the proxy: once stopping, a frame is answered 500 (Lark delivers it
            # again, maybe to another connection) rather than acknowledged unanswered.
            app.long_connection = LongConnection(app_id=s.lark_app_id, app_secret=s.lark_app_secret,
                                                 domain=s.lark_domain, intake=app._intake_proxy(),
                                                 retry_max_s=s.ethan_ws_retry_max_s,
                                                 own_thread=s.ethan_ws_own_thread)
            app.long_connection.start(asyncio.get_running_loop())


async def stop_intake(app: Any, shutdown: Shutdown) -> None:
    if app.long_connection is not None:
        await asyncio.to_thread(app.long_connection.stop)
