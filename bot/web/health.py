"""GET /livez (liveness), GET /healthz (readiness), both JSON, and GET /metrics (Prometheus text).

``/livez`` is 200 whenever this process answers HTTP — whatever the model, Lark or the database
do — so a probe that restarts or routes (Docker's HEALTHCHECK, HAProxy) never takes the console,
where those problems are shown, out of reach. ``/healthz`` is 503 until everything Ethan needs
to answer works: what a deploy script waits for before it sends traffic."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from aiohttp import web

from bot.infra.config import Settings
from bot.infra.log import dropped_lines
from bot.infra.metrics import Metrics


class Probed(Protocol):
    """What the health and metrics endpoints read (the composition root provides it)."""

    settings: Settings
    metrics: Metrics
    ready: bool
    closing: bool
    started_at: float
    db: Any              # storage.Database | None (``is_open``)
    intake: Any          # set once the webhook intake exists
    long_connection: Any  # ``is_connected``, ``status()``
    agent: Any           # ``model.name``
    queue: Any           # ``depth``
    dispatcher: Any      # ``conversations``

    @property
    def identity_known(self) -> bool: ...


def _why_not(ethan: Probed, db_ok: bool, transport: dict) -> str:
    if ethan.closing:
        return "stopping"
    if not ethan.ready:
        return "starting"
    if not db_ok:
        return "database unreachable" if getattr(ethan.db, "dialect", "") == "postgres" else "database closed"
    if not transport["ready"]:
        detail = transport.get("reason")
        return f"{transport['kind']} {transport.get('state', 'not ready')}" + (f": {detail}" if detail else "")
    problem = getattr(ethan, "model_problem", None)
    if problem:
        return f"model: {problem}"     # the start-up check's line, naming the setting
    return ""


def setup_health(web_app: web.Application, ethan: Probed) -> None:
    async def healthz(request: web.Request) -> web.Response:
        s = ethan.settings
        db_ok = ethan.db is not None and ethan.db.is_open
        if db_ok and getattr(ethan.db, "dialect", "sqlite") == "postgres":
            # A server database can be down while we run: ready only while it answers.
            try:
                await asyncio.wait_for(ethan.db.ping(), 2.0)
            except Exception:
                db_ok = False
        if not s.lark_enabled:
            transport = {"kind": "none", "ready": True}
        elif s.lark_transport == "webhook":
            transport = {"kind": "webhook", "ready": ethan.intake is not None}
        else:
            lc = ethan.long_connection
            state = lc.status() if lc is not None else {"state": "starting", "reason": "not started"}
            transport = {"kind": "ws", "ready": bool(lc and lc.is_connected), **state}
        identity = ethan.identity_known
        problem = getattr(ethan, "model_problem", None)
        ready = bool(ethan.ready and db_ok and transport["ready"] and not problem)
        body = {
            "status": "ok" if ready else "stopping" if ethan.closing else "degraded" if problem and ethan.ready
            else "starting",
            "ready": ready,
            "reason": "" if ready else _why_not(ethan, db_ok, transport),
            "database": "open" if db_ok else "closed",
            "transport": transport,
            "bot_identity": identity,
            "model": getattr(ethan.agent.model, "name", "") if ethan.agent else "",
            # the offline model speaks the Anthropic API but is nobody's: say so (issue 52)
            "provider": "offline" if s.offline_model else getattr(ethan.agent.model, "provider", "") if ethan.agent else "",
            "model_ok": None if problem is None else not problem,
            **({"model_problem": problem} if problem else {}),
            "offline_model": s.offline_model,
            "consolidation_queue": ethan.queue.depth if ethan.queue else 0,
            # each MCP server: ok, tool count, restarts, and the problem when not ok (Ethan
            # answers without a failed server's tools; it is not a reason to be unready)
            "mcp_servers": ethan.mcp.status() if getattr(ethan, "mcp", None) is not None else {},
            "uptime_s": round(time.time() - ethan.started_at, 1) if ethan.started_at else 0,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def livez(request: web.Request) -> web.Response:
        # Nothing here waits on anything: answering is the proof of life. ``state`` is what a
        # balancer routes on (deploy/haproxy.cfg expects "serving"): started and not draining,
        # whatever the model or Lark do — a draining replica gets no new requests.
        return web.json_response({
            "status": "alive",
            "state": "stopping" if ethan.closing else "serving" if ethan.ready else "starting",
            "uptime_s": round(time.time() - ethan.started_at, 1) if ethan.started_at else 0,
            "log_lines_dropped": dropped_lines()})

    async def metrics(request: web.Request) -> web.Response:
        ethan.metrics.log_lines_dropped(dropped_lines())
        if ethan.queue is not None:
            ethan.metrics.queue_depth.set(ethan.queue.depth)
        if ethan.dispatcher is not None:
            ethan.metrics.conversations.set(ethan.dispatcher.conversations)
        stats = getattr(getattr(ethan, "db", None), "stats", None)    # PostgreSQL's engine counts its work
        if stats is not None:
            ethan.metrics.database_work(stats.snapshot())
        body, ctype = ethan.metrics.render()
        return web.Response(body=body, headers={"Content-Type": ctype})

    web_app.router.add_get("/livez", livez)
    web_app.router.add_get("/healthz", healthz)
    web_app.router.add_get("/metrics", metrics)
