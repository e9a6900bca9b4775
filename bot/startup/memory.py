"""Start-up steps of the memory side: ``database`` (open it, migrations, the lease clock),
``memory stores``, ``consolidation`` (its queue and the agent's ``Memory``; stopping it
flushes memory work) and ``consolidation workers``. Apart from the other steps because these
are the only ones that touch the database's own life: it opens first and closes last.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from bot.agent.agent import Memory
from bot.infra.log import get_logger
from bot.startup.lifespan import Boot, Shutdown
from memory.episodes.store import EpisodeStore
from memory.facts.store import FactStore
from memory.leases import DatabaseClock
from memory.procedures import ProcedureStore
from memory.profile.modes import ModeStore
from memory.profile.store import ProfileStore
from memory.sessions.store import SessionStore
from memory.working.consolidation_queue import ConsolidationQueue
from memory.working.consolidator import Consolidator
from memory.working.view import WorkingMemory


async def open_database(app: Any, boot: Boot) -> None:
    s = app.settings
    from memory.text.tokenizer import warm_up

    # jieba's dictionary (~0.6 s, holding the interpreter lock most of it) loads beside the
    # database open and before the port opens: loaded while serving, it made the first
    # acknowledgements after a (re)start wait for it.
    boot.t_warm = time.monotonic()
    boot.warming = asyncio.create_task(asyncio.to_thread(warm_up))
    app.db = await s.open_database().open()
    await app.db.start_checkpointer()
    # A PostgreSQL database may be shared by any number of replicas: rows, conversations and
    # consolidation jobs are leased (bot/delivery/replicas.py), in the database's time
    # (memory/leases.py). A SQLite file serves one process, which answers all of it.
    boot.shared = shared = app.db.dialect == "postgres"
    boot.lease_clock = lease_clock = DatabaseClock() if shared else time.time
    if shared:
        await lease_clock.sync(app.db)


async def close_database(app: Any, shutdown: Shutdown) -> None:
    if app.db is not None:
        await app.db.close()


async def open_memory_stores(app: Any, boot: Boot) -> None:
    s = app.settings
    sessions = SessionStore(app.db, idle_timeout=s.ethan_session_idle_hours * 3600)
    working = WorkingMemory(app.db, sessions, app.memory_config)
    facts, procedures = FactStore(app.db), ProcedureStore(app.db)
    from bot.llm.embeddings import build_embedder
    from memory.episodes.vectors import EmbeddingIndexer

    embedder = build_embedder(s)      # None: recall is BM25 alone (ETHAN_EMBEDDING_MODEL empty)
    profile, episodes, modes = ProfileStore(app.db), EpisodeStore(app.db, embedder=embedder), ModeStore(app.db)
    if embedder is not None:          # episodes are embedded in the background, never on the reply path
        app.indexer = EmbeddingIndexer(app.db, embedder)
        episodes.on_written = app.indexer.nudge
    boot.sessions, boot.working, boot.facts, boot.procedures = sessions, working, facts, procedures
    boot.profile, boot.episodes, boot.modes = profile, episodes, modes
    boot.removed = await sessions.cleanup_empty()
    await boot.warming
    boot.warm_ms = int((time.monotonic() - boot.t_warm) * 1000)


async def start_consolidation(app: Any, boot: Boot) -> None:
    s, sessions = app.settings, boot.sessions
    consolidator = Consolidator(app.models.consolidation)
    app.queue = ConsolidationQueue(db=app.db, sessions=sessions, working=boot.working, facts=boot.facts,
                                   profile=boot.profile, episodes=boot.episodes, modes=boot.modes,
                                   consolidator=consolidator, log=get_logger("ethan.consolidation"),
                                   owner=s.replica_id, claim_seconds=s.ethan_lease_seconds,
                                   clock=boot.lease_clock)
    app.memory = Memory(db=app.db, sessions=sessions, working=boot.working, facts=boot.facts,
                        procedures=boot.procedures, profile=boot.profile, episodes=boot.episodes, modes=boot.modes,
                        queue=app.queue)
    # Every close (idle sweep, /new, /resume, idle-on-append) writes the episode off the reply path.
    sessions.add_close_listener(app.queue.request_episode)
    boot.consolidator = consolidator


async def flush_memory(app: Any, shutdown: Shutdown) -> None:
    """The embedding indexer (started by ``consolidation workers``), the queue, empty sessions."""
    if app.indexer is not None:   # an episode half embedded is embedded again at the next start
        await app.indexer.stop()
    if app.queue is not None:
        remaining = max(1.0, shutdown.deadline - (time.monotonic() - shutdown.t0))
        await app.queue.drain(remaining)
    if app.memory is not None:
        with contextlib.suppress(Exception):
            await app.memory.sessions.cleanup_empty()


async def start_consolidation_workers(app: Any, boot: Boot) -> None:
    await app.queue.start()
    await app.queue.recover()
    if app.indexer is not None:
        app.indexer.start()
