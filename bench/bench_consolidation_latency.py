"""Reply latency under consolidation: p50/p95 reply latency while the consolidation queue is
busy, against the same server with the queue idle.

The fake model answers chat in ``CHAT_LATENCY`` and every consolidation call
(``write_summary``, ``extract_memories``) in ``CONSOLIDATION_LATENCY``. *Busy*: before the
server starts, its database is given a backlog — ``BACKLOG`` open sessions of 40 turns each,
never consolidated — which ``ConsolidationQueue.recover()`` queues at start; that is several
minutes of compression, extraction and fact writing for the queue's two workers, so it is busy
for the whole measurement (the consolidation calls the fake model received during the
measurement are reported). *Idle*: the same server and load with an empty database.

Load: ``USERS`` users in their own p2p chats, each sending a message, waiting for the reply at
the fake Lark, and sending the next (closed loop). Latency = POST of the event → the reply
delivered to the fake Lark Open API. Both servers run in a subprocess (``python -m bot serve``).

    python -m bench.bench_consolidation_latency [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    Fakes,
    Server,
    median,
    ms,
    percentile,
    ratio,
    signed_request,
    table,
    temp_home,
)
from tests.fakes.fake_anthropic import Delay, Json, ToolUse, default_responder, forced_tool  # noqa: E402

CHAT_LATENCY = 0.05
CONSOLIDATION_LATENCY = 0.5
USERS = 8
THINK = 0.3          # a user's pause between a reply and the next message (Lark allows 5 sends/s per chat)
BACKLOG = 200
BACKLOG_TURNS = 40


def _install(fakes: Fakes) -> None:
    model = fakes.model
    model.responder = lambda req: Delay(CHAT_LATENCY, default_responder(req))

    def summary(req: dict):
        data = {"summary": "用户和助手讨论了项目排期、预算和接口延迟排查，决定下周继续跟进。" * 4}
        inner = ToolUse("write_summary", data) if forced_tool(req) == "write_summary" else Json(data)
        return Delay(CONSOLIDATION_LATENCY, inner)

    def extract(req: dict):
        data = {"facts": [{"content": "用户在做订单服务的拆分", "category": "knowledge", "importance": 0.8},
                          {"content": "用户喜欢先听结论", "category": "preference", "importance": 0.8}],
                "profile_psych": []}
        inner = ToolUse("extract_memories", data) if forced_tool(req) == "extract_memories" else Json(data)
        return Delay(CONSOLIDATION_LATENCY, inner)

    model.on_tool("write_summary", summary, keys={"summary"})
    model.on_tool("extract_memories", extract, keys={"facts", "profile_psych"})


def _seed_backlog(home: Path, sessions: int, turns: int) -> None:
    """Open sessions with unconsolidated turns, written before the server starts."""
    import asyncio as _asyncio

    from storage import database

    path = home / "ethan.db"
    _asyncio.run(_open_close(database, path))
    now = time.time()
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for s in range(sessions):
            conv, user = f"oc_p2p_backlog_{s}", f"ou_backlog_{s}"
            sid = f"s_{time.strftime('%Y%m%d_%H%M', time.gmtime(now))}_b{s:05d}"
            conn.execute("INSERT INTO sessions(id, title, model, conv_key, chat_id, chat_type, owner_id, created_at,"
                         " updated_at) VALUES (?, '', 'claude-sonnet-4-6', ?, ?, 'p2p', ?, ?, ?)",
                         (sid, conv, conv, user, now - 600, now - 60))
            conn.execute("INSERT INTO conversations(conv_key, chat_id, chat_type, active_session_id, updated_at)"
                         " VALUES (?, ?, 'p2p', ?, ?)", (conv, conv, sid, now - 60))
            rows = []
            for t in range(turns):
                rows.append((sid, "user", f"第{t}轮：订单服务拆分的进度怎么样了？预算还剩多少？我喜欢先听结论。",
                             user, "", now - 600 + t))
                rows.append((sid, "assistant", "进度正常，预算还剩三十万左右。建议先拆读多写少的模块，保留回滚方案。",
                             "", "", now - 600 + t + 0.5))
            conn.executemany("INSERT INTO messages(session_id, role, content, sender_id, sender_name, created_at)"
                             " VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _open_close(database_cls, path: Path) -> None:
    await (await database_cls(path).open()).close()


async def _user_loop(url: str, fakes: Fakes, user: int, n: int, out: list[float]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for i in range(n):
            # a new chat every 10 messages: the measured sessions never become due for compression
            # themselves, so the idle queue stays idle and the busy one is busy with the backlog only
            mid, headers, body = signed_request(f"帮我看看第{i}个问题：这周的排期还来得及吗？",
                                                chat_id=f"oc_p2p_lat_{user}_{i // 10}", sender=f"ou_lat_{user}")
            t0 = time.monotonic()
            async with http.post(url, data=body, headers=headers) as resp:
                await resp.read()
            end = t0 + 30
            while mid not in fakes.lark.replied_at and time.monotonic() < end:
                await asyncio.sleep(0.002)
            if mid in fakes.lark.replied_at:
                out.append(fakes.lark.replied_at[mid] - t0)
            await asyncio.sleep(THINK)


class _Setup:
    """A temporary home (with the backlog when busy), fakes and a launched server."""

    def __init__(self, busy: bool, backlog: int) -> None:
        self.busy = busy
        self.backlog = backlog
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "_Setup":
        home = self.stack.enter_context(temp_home())
        self.fakes = self.stack.enter_context(Fakes())
        _install(self.fakes)
        if self.busy:
            _seed_backlog(home, self.backlog, BACKLOG_TURNS)
        self.server = Server(home, self.fakes).launch()
        self.stack.callback(self.server.stop)
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()


def _phase(setup: _Setup, per_user: int, settle: float, users: int = USERS) -> dict:
    server, fakes = setup.server, setup.fakes
    server.wait_healthy()
    asyncio.run(_warm(server.url, fakes))
    time.sleep(settle)   # let recovery queue the backlog and the first calls start
    calls0 = len(fakes.model.tool_requests())
    lat: list[float] = []
    t0 = time.monotonic()

    async def go() -> None:
        await asyncio.gather(*(_user_loop(server.url + "/lark/events", fakes, u, per_user, lat)
                               for u in range(users)))

    asyncio.run(go())
    wall = time.monotonic() - t0
    calls = len(fakes.model.tool_requests()) - calls0
    server.stop()
    return {"lat": lat, "wall": wall, "calls": calls, "expected": users * per_user, "users": users}


async def _warm(url: str, fakes: Fakes) -> None:
    out: list[float] = []
    await _user_loop(url + "/lark/events", fakes, 999, 2, out)


def run(quick: bool = False) -> list[str]:
    per_user = 3 if quick else 40
    backlog = 20 if quick else BACKLOG
    if quick:
        # both servers start at once to save time: the busy one consolidates while the idle one
        # is measured, so quick numbers do not compare; the full run measures them one at a time
        with _Setup(False, backlog) as idle_setup, _Setup(True, backlog) as busy_setup:
            idle = _phase(idle_setup, per_user, 0.3, users=4)
            busy = _phase(busy_setup, per_user, 0.3, users=4)
    else:
        with _Setup(False, backlog) as setup:
            idle = _phase(setup, per_user, 1.0)
        with _Setup(True, backlog) as setup:
            busy = _phase(setup, per_user, 1.0)
    rows = []
    for name, r in (("idle queue", idle), ("**busy queue** (backlog being consolidated)", busy)):
        lat = r["lat"]
        rows.append((name, f"{len(lat)} of {r['expected']}", ms(median(lat)), ms(percentile(lat, 95)),
                     ms(percentile(lat, 99)), ms(max(lat)) if lat else "—",
                     f"{r['calls']} ({r['calls'] / r['wall']:.1f}/s)"))
    d50 = median(busy["lat"]) - median(idle["lat"])
    d95 = percentile(busy["lat"], 95) - percentile(idle["lat"], 95)
    return [
        "### 6. Reply latency under consolidation",
        "",
        f"{idle['users']} users, closed loop (next message {THINK * 1000:.0f} ms after the reply arrived; a new "
        "p2p chat every 10 messages, so the measured sessions cause no consolidation themselves), "
        f"{per_user} messages each; "
        f"fake model: {CHAT_LATENCY * 1000:.0f} ms per chat answer, {CONSOLIDATION_LATENCY * 1000:.0f} ms per "
        f"consolidation call. Busy: {backlog} open sessions × {BACKLOG_TURNS} unconsolidated turns queued at start "
        "(2 workers). Latency = event POSTed → reply delivered at the fake Lark, ms.",
        "",
        *table(["queue", "replies", "p50", "p95", "p99", "max", "consolidation calls during the run"], rows),
        "",
        ("Quick mode: both servers ran at the same time, so busy and idle do not compare here. " if quick else "")
        + f"Busy − idle: p50 {d50 * 1000:+.1f} ms ({ratio(median(busy['lat']), median(idle['lat']))}), "
        f"p95 {d95 * 1000:+.1f} ms ({ratio(percentile(busy['lat'], 95), percentile(idle['lat'], 95))}).",
    ]


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
