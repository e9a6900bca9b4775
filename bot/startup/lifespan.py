"""The runner of the start-up table: ``Step(name, start, stop)``, run in order at start-up
and stopped in reverse order at shutdown (the idea of nonebot2's driver lifespan).

Shutdown is the mirror of start-up by construction: ``Lifespan.stop`` stops the steps that
started, last first. A step that never started is not stopped; a step whose start raised
half-way is stopped (every stop closes only what exists: each close is guarded); a stop that
raises is logged (``app.stop_step_failed``) and the steps before it still stop. A step's stop
may also stop what later steps made when today's order of shutdown asks for it (e.g.
``clients`` closes the model clients built after the web server; ``delivery`` stops the
reminder scheduler): the table (``bot/startup/steps.py``) says so at each step. ``Boot``
carries what one start-up step hands to a later one (the locals of one start-up);
``Shutdown`` the stop's deadline and what it counted. Apart from the steps so the mechanism
is read, and tested (``tests/test_startup.py``), on its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from bot.infra.log import get_logger

log = get_logger("ethan.startup")


@dataclass(frozen=True)
class Step:
    """One named start-up step; ``start(app, boot)`` and ``stop(app, shutdown)`` take the
    EthanApp (bot/app.py, passed in: this package never imports it). ``None``: nothing to do."""
    name: str
    start: Callable[[Any, "Boot"], Awaitable[None]] | None = None
    stop: Callable[[Any, "Shutdown"], Awaitable[None]] | None = None


@dataclass
class Boot:
    """What the start-up steps hand to each other (one start-up's locals)."""
    t_warm: float = 0.0
    warming: asyncio.Task | None = None      # jieba's dictionary, loading beside the database open
    shared: bool = False                     # a PostgreSQL database: replicas, leases
    lease_clock: Callable[[], float] = time.time
    sessions: Any = None
    working: Any = None
    facts: Any = None
    procedures: Any = None
    profile: Any = None
    episodes: Any = None
    modes: Any = None
    removed: int = 0                         # empty sessions removed at start-up
    warm_ms: int = 0
    model: Any = None                        # the chat model chain (app.models.chat)
    consolidator: Any = None
    deps: Any = None                         # bot.core.handler.HandlerDeps, filled by later steps


@dataclass
class Shutdown:
    """One stop: its deadline (seconds, from ``t0``) and the conversations it cancelled."""
    deadline: float
    t0: float
    cancelled: int = 0


class Lifespan:
    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = tuple(steps)
        self.started: list[Step] = []

    async def start(self, app: Any, boot: Boot) -> None:
        for step in self.steps:
            self.started.append(step)      # entered: stopped even if its start raises
            if step.start is not None:
                await step.start(app, boot)

    async def stop(self, app: Any, shutdown: Shutdown) -> None:
        while self.started:
            step = self.started.pop()
            if step.stop is not None:
                try:
                    await step.stop(app, shutdown)
                except Exception as e:
                    # One stop that fails must not keep the rest from running: the database
                    # close is last, and an unclosed database leaves its non-daemon thread
                    # holding the process at exit (issue 52).
                    log.error("app.stop_step_failed", step=step.name, error=f"{type(e).__name__}: {e}")
