"""Composition root: build stores, clients and the dispatcher; start and stop in order.

Start: open the database (migrations) → memory stores → model client → HTTP server
(health, metrics, webhook, console) → Lark identity and transport → answer what was
acknowledged but not answered before the last stop → background loops.

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
from bot.llm import Models, UsageBook, build_models
from bot.commands.context import CommandDeps, RuntimeStats
from bot.commands.dispatcher import Commands
from bot.infra.config import Settings
from bot.delivery.direct import Conversations
from bot.delivery.dispatcher import Dispatcher
from bot.core.handler import HandlerDeps, MessageHandler
from bot.core.inbound import Inbound
from bot.delivery.inbox_store import Inbox
from bot.delivery.redelivery import Redelivery
from bot.lark.card_clicks import CardClicks
from bot.lark.intake import Intake
from bot.lark.openapi.names import CachedNames
from bot.lark.lifecycle import LarkDecoder, decoded as lark_decoded
from bot.lark.transport.routes import NotAccepting, make_handler
from bot.infra.log import get_logger
from bot.tools import memory_tools
from bot.tools.confirm import ToolConfirmations
from bot.tools.lark_docs import LarkDocs
from bot.tools.mcp import McpServers
from bot.tools.registry import ToolRegistry
from bot.infra.metrics import Metrics
from memory.sessions import chat_events
from bot.delivery.outbox_store import Outbox
from bot.delivery.replicas import Replicas
from bot.core.reply import Reply
from memory.working.consolidation_queue import ConsolidationQueue
from memory.working.consolidator import Consolidator
from memory.leases import DatabaseClock
from storage import Database
from memory.models import caps
from memory.governance.withdraw import cancel_pending
from bot.core.inflight import InFlight
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from memory.profile.modes import ModeStore
from memory.procedures import ProcedureStore
from memory.profile.store import ProfileStore
from memory.sessions.store import SessionStore
from memory.working.view import MemoryConfig, WorkingMemory

log = get_logger("ethan.app")


OFFLINE_PATH = "/_offline"
ANSWER_MARGIN_S = 15.0     # how long past the reply deadline a waiting interface still waits
HEADER_TIMEOUT_S = 15.0    # an idle connection, or one whose request head is unfinished, is closed


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

    # -- start -----------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.started_at = time.time()
        from memory.text.tokenizer import warm_up

        # jieba's dictionary (~0.6 s, holding the interpreter lock most of it) loads beside the
        # database open and before the port opens: loaded while serving, it made the first
        # acknowledgements after a (re)start wait for it.
        t_warm = time.monotonic()
        warming = asyncio.create_task(asyncio.to_thread(warm_up))
        self.db = await s.open_database().open()
        await self.db.start_checkpointer()
        # A PostgreSQL database may be shared by any number of replicas: rows, conversations and
        # consolidation jobs are leased (bot/delivery/replicas.py), in the database's time
        # (memory/leases.py). A SQLite file serves one process, which answers all of it.
        shared = self.db.dialect == "postgres"
        lease_clock = DatabaseClock() if shared else time.time
        if shared:
            await lease_clock.sync(self.db)
        sessions = SessionStore(self.db, idle_timeout=s.ethan_session_idle_hours * 3600)
        working = WorkingMemory(self.db, sessions, self.memory_config)
        facts, procedures = FactStore(self.db), ProcedureStore(self.db)
        from bot.llm.embeddings import build_embedder
        from memory.episodes.vectors import EmbeddingIndexer

        embedder = build_embedder(s)      # None: recall is BM25 alone (ETHAN_EMBEDDING_MODEL empty)
        profile, episodes, modes = ProfileStore(self.db), EpisodeStore(self.db, embedder=embedder), ModeStore(self.db)
        if embedder is not None:          # episodes are embedded in the background, never on the reply path
            self.indexer = EmbeddingIndexer(self.db, embedder)
            episodes.on_written = self.indexer.nudge
        removed = await sessions.cleanup_empty()
        await warming
        warm_ms = int((time.monotonic() - t_warm) * 1000)

        await self._start_http()   # the offline model is served here, so it comes first
        self.models = build_models(s, offline_base_url=self.base_url + OFFLINE_PATH,
                                   offline_api_key=self.auth.offline_key,   # the offline route answers this process only
                                   on_response=self._on_model_response,
                                   on_fallback=self._on_fallback)
        model = self.models.chat
        consolidator = Consolidator(self.models.consolidation)
        self.queue = ConsolidationQueue(db=self.db, sessions=sessions, working=working, facts=facts,
                                        profile=profile, episodes=episodes, modes=modes,
                                        consolidator=consolidator, log=get_logger("ethan.consolidation"),
                                        owner=s.replica_id, claim_seconds=s.ethan_lease_seconds,
                                        clock=lease_clock)
        self.memory = Memory(db=self.db, sessions=sessions, working=working, facts=facts,
                             procedures=procedures, profile=profile, episodes=episodes, modes=modes,
                             queue=self.queue)
        # Every close (idle sweep, /new, /resume, idle-on-append) writes the episode off the reply path.
        sessions.add_close_listener(self.queue.request_episode)
        self.tools = ToolRegistry([memory_tools()], policy=s.tools.policy(), on_call=self.metrics.count_tool,
                                  max_result_chars=s.tools.max_result_chars)
        # MCP servers (config.yaml mcp_servers:): connected before the port serves chats; one
        # that fails is logged, shown in /healthz, retried, and its tools are simply not offered.
        self.mcp = McpServers(s.mcp_servers, ping_seconds=self.mcp_ping_seconds, budget=s.tools.budget())
        if s.tools.lark_docs and s.lark_enabled:   # pasted Feishu doc links (offered once Lark is up)
            self.tools.add(LarkDocs(lambda: self.lark_api))
        for server in self.mcp.servers:
            self.tools.add(server)
        await self.mcp.start()
        self.agent = Agent(self.memory, model, deadline=s.ethan_reply_deadline,
                           on_failure=self._on_model_failure, on_call=self.metrics.model_calls.inc,
                           tools=self.tools)
        from bot.schedules.reminders import Limits, Reminders
        from bot.schedules.timezones import UserZones
        from bot.schedules.tool import ReminderTools
        from memory.schedules.store import ScheduleStore

        # Due times and reminder leases in the database's time too: a replica whose clock runs
        # ahead would otherwise send a reminder early and take over another's live claim.
        self.schedules = ScheduleStore(self.db, owner=s.replica_id or None, clock=lease_clock)
        self.zones = UserZones(None, profile, s.ethan_timezone)     # Lark's contact API once connected
        self.reminders = Reminders(self.schedules, self.zones, Limits(
            per_user=s.ethan_reminders_per_user, per_chat=s.ethan_reminders_per_chat,
            horizon_days=s.ethan_reminder_horizon_days,
            grace_hours=s.ethan_reminder_grace_hours), wake=lambda: self.scheduler and self.scheduler.wake())
        self.tools.add(ReminderTools(self.reminders))      # schedule_message, list_schedules, cancel_schedule
        self.commands = Commands(CommandDeps(memory=self.memory, is_admin=s.is_admin,
                                             bot_open_id=self.bot_open_id, runtime=self._runtime,
                                             reminders=self.reminders))
        self.inbox = Inbox(self.db, owner=s.replica_id, lease_seconds=s.ethan_lease_seconds,
                           conversations=shared, clock=lease_clock)
        self.redelivery = redelivery = Redelivery(self.inbox, closing=lambda: self.closing, spawn=self._spawn)
        redelivery.in_thread = _in_thread
        if shared:
            self.replicas = redelivery.replicas = Replicas(self.inbox, lambda: self.dispatcher,
                                                           waiting=lambda: redelivery.waiting,
                                                           clock=lease_clock)
            if self.recover_inbox:      # `ethan chat` beside a server takes no Lark work
                await self.replicas.claim_id()      # or ReplicaIdInUse: another live process has the id
            # Renewing from now on: the id's lease (and every row this replica stores) must
            # outlive a slow start-up (the model check, MCP servers).
            self._spawn(self.replicas.heartbeat(), "replica-heartbeat")
        self.outbox = Outbox(self.db)
        deps = HandlerDeps(
            inbox=self.inbox, agent=self.agent, commands=self.commands,
            decode=LarkDecoder(self.bot_open_id), make_reply=self._make_reply, bot_open_id=self.bot_open_id, is_admin=s.is_admin,
            respond_to_all=s.ethan_respond_to_all, names=None,
            on_ignored=lambda reason: self.metrics.ignored.labels(reason=reason).inc(),
            on_replied=self._on_replied, retry_later=redelivery.retry_later,
        )
        if s.lark_enabled:
            from bot.lark.openapi.client import OpenApi
            from bot.lark.outbound import LarkSender

            # One pooled aiohttp session, owned by OpenApi: made in this loop on the first call,
            # closed by lark_api.aclose() in stop().
            self.lark_api = OpenApi(s.lark_app_id, s.lark_app_secret, s.lark_domain, timeout=10.0)
            self.sender = redelivery.sender = LarkSender(self.lark_api)
        self.zones.api = self.lark_api
        # Group speakers' names: looked up in Lark when connected (the console names its own).
        self.names = deps.names = CachedNames(self.lark_api)
        # Lark beyond text: the registry's other events, and attachments (issue 20).
        # The adapter translates (bot/lark/events.py, lifecycle.py), the core decides (bot/core/lifecycle.py).
        from bot.lark.lifecycle import LarkActions
        from bot.core.lifecycle import Lifecycle, LifecycleDeps

        deps.events = Lifecycle(LifecycleDeps(
            db=self.db, finish=self.inbox.finish, run_command=self.commands.run,
            actions=LarkActions(self.sender, self.lark_api) if self.sender is not None else None,
            recall_replies=s.ethan_recall_replies, confirm_ttl_s=s.ethan_confirm_card_minutes * 60))
        if self.lark_api is not None:
            from bot.lark.openapi.resources import LarkFetcher

            deps.fetch = LarkFetcher(self.lark_api, self.names)
        from bot.media.parse_pool import ParseLimits, ParsePool

        self.parse_pool = deps.parse_pool = ParsePool(ParseLimits(
            workers=s.ethan_parse_workers, cpu_seconds=s.ethan_parse_cpu_seconds,
            timeout=s.ethan_parse_timeout, memory_mb=s.ethan_parse_memory_mb))
        deps.vision = lambda: caps(getattr(self.agent.model, "name", "")).vision
        if self.lark_api is not None:
            from bot.lark.openapi.quoted import LarkQuotes

            deps.quote = LarkQuotes(self.lark_api, self.names, vision=deps.vision, pool=self.parse_pool)
            from bot.lark.openapi.chats import CachedChatModes
            from bot.lark.openapi.discussion import LarkDiscussion

            deps.discussion = LarkDiscussion(self.lark_api, self.names,
                                             budget_tokens=s.ethan_group_context_tokens)

            deps.decode = LarkDecoder(self.bot_open_id, CachedChatModes(self.lark_api).is_topic_chat)
        from bot.media.stt import from_settings as speech_to_text

        self.stt = deps.stt = speech_to_text(s)
        deps.last_words = self.memory.sessions.last_user_text
        self.inflight = deps.inflight = InFlight()
        self.handler = redelivery.handler = MessageHandler(deps)
        self.dispatcher = redelivery.dispatcher = Dispatcher(redelivery.handle, max_concurrency=s.ethan_max_concurrency,
                                     admit=self._admit,
                                     on_idle=self.replicas.on_idle if self.replicas is not None else None)
        self.intake = Intake(self.inbox, self.dispatcher,
                             on_event=lambda status: self.metrics.events.labels(status=status).inc(),
                             on_recall=self._on_recall,
                             on_tool_click=self.confirmations.click,
                             on_card_click=CardClicks(self.db, ttl_s=s.ethan_confirm_card_minutes * 60).decide)
        if s.lark_enabled:
            self._spawn(self._resolve_identity(), "identity")
            if s.lark_transport == "ws":
                from bot.lark.transport.ws import LongConnection

                # Through the proxy: once stopping, a frame is answered 500 (Lark delivers it
                # again, maybe to another connection) rather than acknowledged unanswered.
                self.long_connection = LongConnection(app_id=s.lark_app_id, app_secret=s.lark_app_secret,
                                                      domain=s.lark_domain, intake=self._intake_proxy(),
                                                      retry_max_s=s.ethan_ws_retry_max_s,
                                                      own_thread=s.ethan_ws_own_thread)
                self.long_connection.start(asyncio.get_running_loop())
        for line in s.model_warnings():
            log.warning("config.model_mismatch", problem=line)
        await self._check_model()
        await self.queue.start()
        await self.queue.recover()
        if self.indexer is not None:
            self.indexer.start()
        if self.recover_inbox:
            await redelivery.recover()
        self._spawn(redelivery.housekeeping(close_idle=self._close_idle, outbox=self.outbox), "housekeeping")
        if self.sender is not None and self.recover_inbox:    # `ethan chat` beside a server sends none
            from bot.schedules.scheduler import LarkDelivery, Scheduler

            self.scheduler = Scheduler(self.schedules, LarkDelivery(self.sender, self.db),
                                       compose=self._compose_reminder, clock=self.schedules.clock,
                                       grace_s=s.ethan_reminder_grace_hours * 3600)
            self.scheduler.start()
        if self.replicas is not None and self.recover_inbox:   # `ethan chat` beside a server leaves its events alone
            self._spawn(self.replicas.poll(), "replica-poll")
        log.info("app.warmed", warm_up_ms=warm_ms)
        self.ready = True
        log.info("app.ready", url=self.base_url, lark=s.lark_transport if s.lark_enabled else "off",
                 model=model.name, provider=model.provider, consolidation_model=consolidator.model,
                 fallbacks=[f"{m.provider}:{m.name}" for m in model.models[1:]],
                 offline_model=s.offline_model, removed_empty_sessions=removed)

    async def _check_model(self) -> None:
        """Wrong key, unknown model, unreachable endpoint: one line naming the setting and a
        degraded /healthz, not an apology to every user forever. The process keeps serving
        (the console shows the problem); a later successful answer clears it."""
        if self.settings.offline_model or self.models is None:
            self.model_problem = ""
            return
        from bot.llm.health import check_models

        # Every configured model (main, fallbacks, consolidation): a fallback or consolidation
        # model without a key would otherwise fail only when it is needed.
        self.model_problem = await check_models(self.settings, self.models)
        if self.model_problem:
            log.error("model.unusable", problem=self.model_problem)

    def _on_model_failure(self, kind: str) -> None:
        self.metrics.model_failures.labels(kind=kind).inc()
        if kind in ("auth", "not_found") and self.models is not None:
            from bot.llm.health import problem_line

            self.model_problem = problem_line(self.settings, self.models.chat.models[0], kind)

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

    async def _start_http(self) -> None:
        from bot.offline.server import setup_offline_model
        from bot.web.console import ConsoleDeps, setup_console
        from bot.web.errors import quiet_malformed_requests
        from bot.web.health import setup_health

        s = self.settings
        quiet_malformed_requests()
        setup_health(self.web, self)
        if s.lark_enabled and s.lark_transport == "webhook":
            # Load the cipher now, off the loop: the first requests after a restart (Lark's
            # redeliveries) must be acknowledged within 3 s like any other.
            import importlib

            await asyncio.to_thread(importlib.import_module, "Crypto.Cipher.AES")
            handler = make_handler(self._intake_proxy(), encrypt_key=s.lark_encrypt_key,
                                   verification_token=s.lark_verification_token,
                                   on_refused=lambda r: self.metrics.refused.labels(reason=r).inc())
            self.web.router.add_post("/lark/events", handler)
        if s.offline_model:
            setup_offline_model(self.web, OFFLINE_PATH)
        setup_console(self.web, ConsoleDeps(
            memory=lambda: self.memory, conversations=self.conversations, bot_open_id=self.bot_open_id,
            auth=self.auth, offline_model=s.offline_model, model_problem=lambda: self.model_problem,
            is_admin=s.is_admin))
        # keepalive_timeout also bounds a connection that never completes its request head
        # (aiohttp arms it at connect; data arriving does not re-arm it); body reads have their
        # own deadline (bot/web/auth.py read_body_within, bot/lark/transport/routes.py). Lingering after
        # an early answer is kept short so refused half-bodies do not hold sockets.
        self._runner = web.AppRunner(self.web, access_log=None, handle_signals=False,
                                     shutdown_timeout=2.0, keepalive_timeout=HEADER_TIMEOUT_S,
                                     lingering_time=2.0)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, s.ethan_host, s.ethan_port, reuse_address=True)
        await self._site.start()
        sockets = getattr(self._site._server, "sockets", None) or []
        if sockets:
            self.port = sockets[0].getsockname()[1]

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
        if self.long_connection is not None:
            await asyncio.to_thread(self.long_connection.stop)
        cancelled = 0
        if self.dispatcher is not None:
            cancelled = await self.dispatcher.stop(deadline)
        if self.parse_pool is not None:       # after the replies: none is parsing any more
            await self.parse_pool.stop()
        if self.scheduler is not None:        # before the database and the Lark client close
            await self.scheduler.stop()
        if self.redelivery is not None:       # retry timers: their items stay pending in the inbox
            self.redelivery.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.replicas is not None and self.replicas.id_held:
            # What this replica did not answer goes to the others now, not after the lease
            # (an upgrade one replica at a time leaves no gap).
            try:
                await self.inbox.release_all()
            except Exception as e:  # noqa: BLE001 - the leases expire by themselves
                log.warning("replica.release_failed", replica=self.inbox.owner, error=str(e)[:200])
        if self.mcp is not None:       # stdio servers end with us (and after SIGKILL: mcp_child.py)
            await self.mcp.stop()
        if self.indexer is not None:   # an episode half embedded is embedded again at the next start
            await self.indexer.stop()
        if self.queue is not None:
            remaining = max(1.0, deadline - (time.monotonic() - t0))
            await self.queue.drain(remaining)
        if self.memory is not None:
            with contextlib.suppress(Exception):
                await self.memory.sessions.cleanup_empty()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.lark_api is not None:
            await self.lark_api.aclose()
        if self.models is not None:
            await self.models.aclose()
        if self.stt is not None:
            with contextlib.suppress(Exception):
                await self.stt.aclose()
        if self.db is not None:
            await self.db.close()
        log.info("app.stopped", cancelled_conversations=cancelled,
                 elapsed_ms=int((time.monotonic() - t0) * 1000))

    async def __aenter__(self) -> "EthanApp":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


def _in_thread(item) -> bool:
    """Whether a stored Lark item's message is in a thread: the intake's decoded event (no
    second parse). ``ValueError`` / ``RecursionError`` for a payload that does not parse."""
    ev = lark_decoded(item)
    return ev is not None and ev.in_thread


FORCE_EXIT_GRACE_S = 8.0     # default deadline 20 s + 8 < systemd's TimeoutStopSec=30
FULL_COLLECTION_EVERY = 100  # middle-generation collections per full one (CPython: 10)
EXIT_FORCED = 1


def _force_exit(reason: str, signal_name: str) -> None:
    log.warning("app.stop_forced", reason=reason, signal=signal_name, exit_code=EXIT_FORCED)
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
