"""Composition root: build stores, clients and the dispatcher; start and stop in order.

Start and stop run the named steps of ``bot/startup/steps.py`` (``STEPS``): start-up top to
bottom — open the database (migrations) → memory stores → HTTP server (health, metrics,
webhook, offline model, console) → models → … → Lark identity and transport → answer what was
acknowledged but not answered before the last stop → background loops; shutdown the started
steps bottom to top.

Stop: stop intake (long connection closed, webhook answers 503 so Lark redelivers) →
drain in-flight replies within the deadline → cancel the rest (still pending in the
inbox) → end the parse workers → drain consolidation (pending work stays derivable) → close clients → close
the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from typing import Any

from aiohttp import web

from bot.agent.agent import Agent, Memory
from bot.llm import Models, UsageBook
from bot.commands.context import RuntimeStats
from bot.commands.dispatcher import Commands
from bot.infra.config import Settings
from bot.delivery.direct import Conversations
from bot.delivery.dispatcher import Dispatcher
from bot.core.inbound import Inbound
from bot.delivery.inbox_store import Inbox
from bot.delivery.redelivery import Redelivery
from bot.lark.intake import Intake
from bot.lark.openapi.names import CachedNames
from bot.lark.transport.routes import NotAccepting
from bot.infra.log import get_logger
from bot.tools.confirm import ToolConfirmations
from bot.tools.mcp import McpServers
from bot.tools.registry import ToolRegistry
from bot.infra.metrics import Metrics
from bot.startup.lifespan import Boot, Lifespan, Shutdown
from bot.startup.steps import STEPS
from memory.sessions import chat_events
from bot.delivery.outbox_store import Outbox
from bot.delivery.replicas import Replicas
from bot.core.reply import Reply
from memory.working.consolidation_queue import ConsolidationQueue
from storage import Database
from memory.governance.withdraw import cancel_pending
from bot.core.inflight import InFlight
from memory.working.view import MemoryConfig

log = get_logger("ethan.app")


ANSWER_MARGIN_S = 15.0     # how long past the reply deadline a waiting interface still waits


class EthanApp:
    def __init__(self, settings: Settings, *, memory_config: MemoryConfig | None = None,
                 recover_inbox: bool = True) -> None:
        self.settings = settings
        # False for a second process on the same database (ethan chat beside ethan serve): the
        # server's unanswered Lark events are the server's to answer.
        self.recover_inbox = recover_inbox
        self.memory_config = memory_config or MemoryConfig()
        self.metrics = Metrics()
        self.usage = UsageBook()
        from bot.web.auth import ConsoleAuth, read_body_within
        from bot.web.errors import storage_errors

        # One access decision for every route (bot/web/auth.py): a route added later is covered.
        self.auth = ConsoleAuth.from_settings(settings)
        self.web = web.Application(client_max_size=1024 * 1024,
                                   middlewares=[self.auth.middleware, read_body_within(), storage_errors()])
        self.db: Database | None = None
        self.memory: Memory | None = None
        self.agent: Agent | None = None
        self.dispatcher: Dispatcher | None = None
        self.inbox: Inbox | None = None
        self.outbox: Outbox | None = None
        self.intake: Intake | None = None
        self.queue: ConsolidationQueue | None = None
        self.indexer = None                 # memory.episodes.vectors.EmbeddingIndexer, with an embedding model
        self.commands: Commands | None = None
        self.lark_api = None
        self.sender = None
        self.names: CachedNames | None = None
        self.long_connection = None
        self.inflight: InFlight | None = None
        self.stt = None            # bot/media/stt.py: voice messages' speech to text (ETHAN_STT_MODEL)
        self.parse_pool = None     # bot/media/parse_pool.py: attachment parsing, off the loop
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._background: set[asyncio.Task] = set()
        # Retries, user notices and start-up recovery of acknowledged events (bot/delivery/redelivery.py).
        self.redelivery: Redelivery | None = None
        self.replicas: Replicas | None = None      # a shared (PostgreSQL) database: leases
        self.schedules = None                      # memory.schedules.store.ScheduleStore
        self.reminders = None                      # bot.schedules.reminders.Reminders (tools, /reminders)
        self.scheduler = None                      # bot.schedules.scheduler.Scheduler: the one reminder task
        self._bot_open_id = ""
        self._identity = asyncio.Event()
        self.models: Models | None = None
        self.tools: ToolRegistry | None = None
        self.mcp: McpServers | None = None
        self.confirmations = ToolConfirmations()   # side-effecting tool calls awaiting a click
        self.mcp_ping_seconds = 15.0     # how soon an idle MCP server's death is noticed
        # The model's state for /healthz: None until checked; "" when fine; else the one line
        # naming the setting (a wrong key, an unknown model, an unreachable endpoint).
        self.model_problem: str | None = None
        self.started_at = 0.0
        self.ready = False
        self.closing = False
        self.port = settings.ethan_port
        self.lifespan = Lifespan(STEPS)   # start-up and shutdown, in order
        # The console playground, the terminal chat and /chat: into the same mailboxes.
        self.conversations = Conversations(
            lambda: self.dispatcher, accepting=lambda: self.ready and not self.closing,
            timeout=settings.ethan_reply_deadline + ANSWER_MARGIN_S)

    # -- properties ------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host = self.settings.ethan_host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.port}"

    @property
    def identity_known(self) -> bool:
        return (not self.settings.lark_enabled) or self._identity.is_set()

    async def bot_open_id(self) -> str:
        """The bot's own open_id; waits until bot/v3/info has answered."""
        if not self.settings.lark_enabled:
            return "ou_console_bot"
        await self._identity.wait()
        return self._bot_open_id

    # -- start ---------------------------------------------------------------------
    async def start(self) -> None:
        """Run the start-up steps in order (bot/startup/steps.py)."""
        self.started_at = time.time()
        await self.lifespan.start(self, Boot())

    def _on_model_failure(self, kind: str, detail: str = "") -> None:
        self.metrics.model_failures.labels(kind=kind).inc()
        # what retrying cannot fix names its setting on /healthz and in /chat's 503 (issue 52)
        if kind in ("auth", "not_found", "connection", "spend_limit") and self.models is not None:
            from bot.llm.health import problem_line
            from bot.llm.policy import NO_ROUTES

            if kind == "not_found" and NO_ROUTES in (self.model_problem or ""):
                return      # the check blamed the base URL: a chat 404 must not blame ETHAN_MODEL
            self.model_problem = problem_line(self.settings, self.models.chat.models[0], kind, detail)

    def _on_model_response(self, response) -> None:
        self.metrics.count_response(response)
        self.usage.add(response)
        main = self.models.chat.models[0] if self.models is not None else None
        if self.model_problem and main is not None and response.provider == main.provider \
                and response.model.startswith(main.name):
            self.model_problem = ""     # the main model answered after all (a key fixed, a server back)

    def _on_fallback(self, failed, nxt, kind: str) -> None:
        self.metrics.model_fallbacks.labels(from_model=f"{failed.provider}:{failed.name}",
                                            to_model=f"{nxt.provider}:{nxt.name}", kind=kind).inc()

    async def _admit(self) -> None:
        if self.intake is not None:
            await self.intake.quiet()

    def _intake_proxy(self):
        app = self

        class _Proxy:
            async def accept(self, raw: str, body: dict):
                if app.intake is None or app.closing:
                    raise NotAccepting()  # -> 503, Lark redelivers
                return await app.intake.accept(raw, body)

        return _Proxy()

    async def _resolve_identity(self) -> None:
        delay = 1.0
        while True:
            try:
                info = await self.lark_api.bot_info()
                self._bot_open_id = info.open_id
                self._identity.set()
                log.info("lark.identity", bot_open_id=info.open_id, app_name=info.app_name)
                return
            except Exception as e:  # noqa: BLE001
                log.warning("lark.identity_failed", error=str(e)[:200], retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 300)

    async def _close_idle(self) -> None:
        for info in await self.memory.sessions.close_idle():
            self.queue.request_episode(info)

    async def _compose_reminder(self, job) -> str:
        """A reminder that asked to be written at its time: the model, with its owner's memory
        (as in the chat where it was set), writes the message; no tools, the reply deadline."""
        from bot.agent.loop import run_loop
        from bot.agent.prompt import build_system
        from bot.tools import ToolContext
        from memory.scope import Scope
        from memory.working.view import ContextView

        scope = Scope(user_id=job.owner_id, chat_id=job.chat_id, chat_type=job.chat_type)
        m = self.memory
        blocks = await self.agent.gather(scope, job.text, session_id="", mode="work",
                                         view=ContextView(long_term="", summary="", hot_turns=[], pending=0))
        ask = (f"[scheduled message] It is now time for the message the user asked you to send them at "
               f"this time. Their request: {job.text}\nWrite that message now, to them, in their language, "
               f"using what you know about them. Only the message.")
        ctx = ToolContext(scope=scope, facts=m.facts, procedures=m.procedures, profile=m.profile,
                          user_text=job.text, session_id="")
        result = await run_loop(self.agent.model, system=build_system(blocks),
                                messages=[{"role": "user", "content": ask}], registry=ToolRegistry([]), ctx=ctx,
                                on_text=None, deadline=time.monotonic() + self.settings.ethan_reply_deadline)
        return result.text.strip() or job.text

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _on_replied(self, seconds: float) -> None:
        self.metrics.replies.inc()
        self.metrics.latency.observe(seconds)

    def _runtime(self) -> RuntimeStats:
        agent = self.agent
        return RuntimeStats(model_calls=agent.calls if agent else 0,
                            model_failures=agent.failures if agent else 0, started_at=self.started_at,
                            usage=tuple(self.usage.rows()))

    async def _on_recall(self, message_id: str, chat_id: str) -> int:
        """At intake, before the recall queues behind what it cancels: the answer being
        written now is stopped (bot/core/inflight.py), a pending one never starts."""
        stopped = self.inflight.stop(message_id, chat_id) if self.inflight is not None else False
        return int(stopped) + await cancel_pending(self.db, message_id, chat_id)

    def _make_reply(self, inbound: Inbound, *, resumed: bool = False) -> Reply:
        """The reply for a stored (Lark) message."""
        if self.sender is None:
            # No Lark transport, e.g. an event an earlier Lark-connected run left pending.
            from bot.core.reply import CollectingReply

            return CollectingReply()
        from bot.lark.outbound import LarkReply
        from bot.lark.outbound.render import LOCALES

        reply = LarkReply(self.sender, message_id=inbound.message_id, chat_id=inbound.chat_id,
                          in_thread=inbound.in_thread, uuid_base=f"r-{inbound.message_id}",
                          cards=self.outbox, resumed=resumed, locale=LOCALES.get(inbound.language, "zh_cn"))
        if self.settings.ethan_recall_replies and self.outbox is not None:
            reply.record_sent = self.outbox.text_sent
        reply.tool_confirmations, reply.asker = self.confirmations, inbound.sender_id
        reply.record_confirm_card = lambda mid, user: chat_events.confirm_card_sent(self.db, mid, user)
        reply.record_memory_card = lambda mid, owner, kind: chat_events.memory_card_sent(self.db, mid, owner, kind)
        return reply

    # -- stop ------------------------------------------------------------------------
    async def stop(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.ready = False
        deadline = self.settings.ethan_shutdown_deadline
        t0 = time.monotonic()
        log.info("app.stopping", deadline_s=deadline)
        shutdown = Shutdown(deadline=deadline, t0=t0)
        await self.lifespan.stop(self, shutdown)   # the started steps, last first
        log.info("app.stopped", cancelled_conversations=shutdown.cancelled,
                 elapsed_ms=int((time.monotonic() - t0) * 1000))

    async def __aenter__(self) -> "EthanApp":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


FORCE_EXIT_GRACE_S = 8.0     # default deadline 20 s + 8 < systemd's TimeoutStopSec=30
FULL_COLLECTION_EVERY = 100  # middle-generation collections per full one (CPython: 10)
EXIT_FORCED = 1


def _force_exit(reason: str, signal_name: str) -> None:
    try:       # the exit must not depend on its line being written
        log.warning("app.stop_forced", reason=reason, signal=signal_name, exit_code=EXIT_FORCED)
    finally:
        os._exit(EXIT_FORCED)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then stop in order."""
    import signal

    app = EthanApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():     # a second signal: the operator wants it gone now
            _force_exit("second signal", sig.name)
        stop.set()
        # The stop is bounded by the deadline; whatever hangs past it (a stuck thread, an
        # interpreter-exit join) must not leave a process that only SIGKILL ends.
        limit = settings.ethan_shutdown_deadline + FORCE_EXIT_GRACE_S
        timer = threading.Timer(limit, _force_exit, args=(f"still running {limit:.0f}s after the signal", sig.name))
        timer.daemon = True
        timer.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        await app.start()
    except BaseException:
        await app.stop()   # closes the database; its thread would keep the process alive
        raise
    # What start-up loaded (jieba's dictionary, pydantic schemas, the SDKs) lives as long as the
    # process: out of the collector's sight, a full collection no longer walks those objects
    # while requests wait (~100 ms now and then under load). Here, not in EthanApp.start: a
    # process that starts apps repeatedly (the tests) would freeze each one's garbage for good.
    if app.long_connection is not None:
        # The SDK's module graph (imported on a thread once the long connection starts, ~2 s)
        # lives as long as the process too: frozen with the rest, or every full collection
        # walks it (40–130 ms pauses under load, the long connection's acknowledgement tail).
        from bot.lark.transport import compat
        # An SDK that fails to import is the long connection's to report (its state, /healthz).
        with contextlib.suppress(Exception):
            await asyncio.to_thread(compat.session_class)
    gc.freeze()
    # A full collection walks every object made since (the conversations' queued events, open
    # requests: 20–40 ms under load, one every ~10 s at 200 events/s — the top of the
    # acknowledgement tail). Young collections still free most cycles; what reaches the old
    # generation waits 10× longer for its full collection (bench/README.md §1b).
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_EVERY)
    s = settings
    if not s.lark_enabled:
        log.info("app.console_only", url=app.base_url + "/",
                 note="no LARK_APP_ID/LARK_APP_SECRET: Lark transport off, console only")
    if s.offline_model:
        log.info("app.offline_model", note="no model configured (ANTHROPIC_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL): "
                 "using the built-in offline model")
    try:
        await stop.wait()
    finally:
        await app.stop()
