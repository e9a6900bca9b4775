"""The app's start-up and shutdown, in order: ``STEPS``, one ``Step(name, start, stop)`` each.

``EthanApp.start`` runs the starts top to bottom; ``EthanApp.stop`` runs the stops of the
steps that started bottom to top (``bot/startup/lifespan.py``), which is today's shutdown:
stop intake (``lark transport``; the webhook answers 503 once ``closing`` is set) → drain the
replies and end the parse workers (``message path``) → cancel the scheduler, retry timers and
background loops, release this replica's rows (``delivery``) → flush: MCP servers (``tools``),
the embedding indexer, the consolidation queue, empty sessions (``consolidation``) → close:
the port (``web server``), the outbound clients (``clients``), the database (``database``).
docs/internals.md lists the same steps ("Start-up and shutdown"; ``tests/test_startup.py``
keeps the two equal). Apart from the steps themselves so the order is read in one place.
"""

from __future__ import annotations

from typing import Any

from bot.infra.log import get_logger
from bot.startup import agent, delivery, memory, messages, models, web
from bot.startup.lifespan import Boot, Step

log = get_logger("ethan.app")


async def announce_ready(app: Any, boot: Boot) -> None:
    s, model = app.settings, boot.model
    log.info("app.warmed", warm_up_ms=boot.warm_ms)
    app.ready = True
    log.info("app.ready", url=app.base_url, lark=s.lark_transport if s.lark_enabled else "off",
             model=model.name, provider="offline" if s.offline_model else model.provider, consolidation_model=boot.consolidator.model,
             fallbacks=[f"{m.provider}:{m.name}" for m in model.models[1:]],
             offline_model=s.offline_model, removed_empty_sessions=boot.removed)


STEPS: tuple[Step, ...] = (
    Step("database", memory.open_database, memory.close_database),
    Step("memory stores", memory.open_memory_stores),
    Step("clients", None, models.close_clients),          # closes what "models", "lark client", "message path" made
    Step("web server", web.start_web_server, web.close_web_server),   # before "models": it serves the offline model
    Step("models", models.build_model_clients),          # closed by "clients"
    Step("consolidation", memory.start_consolidation, memory.flush_memory),
    Step("tools", agent.start_tools, agent.stop_tools),
    Step("agent", agent.start_agent),
    Step("reminders", agent.start_reminders),
    Step("commands", agent.start_commands),
    Step("delivery", delivery.start_delivery, delivery.stop_delivery),
    Step("outbox", messages.start_outbox),
    Step("lark client", messages.start_lark_client),     # closed by "clients"
    Step("message path", messages.start_message_path, messages.drain_messages),
    Step("lark transport", messages.start_lark_transport, messages.stop_intake),
    Step("model check", models.check_model),
    Step("consolidation workers", memory.start_consolidation_workers),   # stopped by "consolidation"
    Step("inbox recovery", delivery.recover_inbox),
    Step("housekeeping", delivery.start_housekeeping),   # cancelled by "delivery"
    Step("scheduler", delivery.start_scheduler),         # stopped by "delivery"
    Step("replica poll", delivery.start_replica_poll),   # cancelled by "delivery"
    Step("ready", announce_ready),
)
