"""End-to-end throughput: signed, encrypted events posted to ``/lark/events`` until the fake
Lark Open API has received every reply, with a zero-latency fake model.

The server runs in a subprocess (``python -m bot serve``), so its CPU time is read from
``/proc/<pid>/stat`` apart from the fakes and the load generator; per thread, so the event
loop is told apart from the SQLite thread. A second, identical run under cProfile (switched
on for the load only) shows where the event loop's time goes.

Baseline (DESIGN §5, the cost trap): one reply sent through lark-oapi's async API
(``lark_oapi.Client`` ``im.v1.message.areply``, which opens a new ``httpx.AsyncClient`` —
and builds a new TLS context — per call) against Ethan's pooled client (``OpenApi`` over one
long-lived ``aiohttp.ClientSession``), CPU ms per send. The fake Lark runs in a subprocess there,
so the benchmark process's CPU time is the client's alone.

    python -m bench.bench_throughput [--quick]
"""

from __future__ import annotations

import asyncio
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    APP_ID,
    APP_SECRET,
    Fakes,
    Server,
    median,
    ms,
    percentile,
    post_all,
    ratio,
    signed_request,
    table,
    temp_home,
)

TARGET_MSGS_PER_S = 200
TEXTS = [
    "帮我看看这个项目的预算和排期，下周要和客户开会",
    "Can you summarise what we decided about the release schedule?",
    "明天下午三点提醒我给设计团队发邮件",
    "What's a good way to structure the quarterly report for the team?",
    "我们的服务器延迟最近有点高，有什么排查思路吗",
]


# ---- end to end ---------------------------------------------------------------------------

def _requests(convs: int, per_conv: int) -> list[tuple[str, dict, bytes]]:
    out = []
    for m in range(per_conv):
        for c in range(convs):
            text = f"{TEXTS[(c + m) % len(TEXTS)]} ({m})"
            out.append(signed_request(text, chat_id=f"oc_p2p_tp_{c}", sender=f"ou_tp_{c}"))
    return out


def _children_cpu() -> float:
    """CPU of finished child processes (the load generator; the server is still running)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _e2e(convs: int, per_conv: int, concurrency: int, profile: Path | None, **env: str) -> dict:
    """``env``: extra server environment (bench_paired runs another checkout's code through
    ``pythonpath``)."""
    with temp_home() as home, Fakes() as fakes:
        server = Server(home, fakes, profile=profile, **env).start()
        try:
            # one message first: warms the server's lazy paths (token, identity, jieba)
            warm = [signed_request("hello", chat_id="oc_p2p_warm", sender="ou_warm")]
            asyncio.run(post_all(server.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(1, 30)
            reqs = _requests(convs, per_conv)
            n = len(reqs) + 1
            sent: dict[str, float] = {}
            if profile is not None:
                server.profile_on()
            threads0, cpu0 = server.thread_cpu(), server.cpu_seconds()
            fakes0, load0 = time.process_time(), _children_cpu()
            t0 = time.monotonic()
            acks, statuses = asyncio.run(post_all(server.url + "/lark/events", reqs, concurrency, sent_at=sent))
            got = fakes.lark.wait_delivered(n, 300) - 1
            wall = time.monotonic() - t0
            cpu, threads1 = server.cpu_seconds() - cpu0, server.thread_cpu()
            fakes_cpu, load_cpu = time.process_time() - fakes0, _children_cpu() - load0
            if profile is not None:
                server.profile_off()
            loop = threads1.get(server.pid, 0) - threads0.get(server.pid, 0)
            replies = [fakes.lark.replied_at[m] - t for m, t in sent.items() if m in fakes.lark.replied_at]
            bad = sum(1 for s in statuses if s != 200)
            return {
                "messages": len(reqs), "delivered": got, "wall": wall, "cpu": cpu, "loop_cpu": loop,
                "acks": acks, "replies": replies, "bad": bad, "fakes_cpu": fakes_cpu, "load_cpu": load_cpu,
            }
        finally:
            server.stop()


# ---- work per message, counted (deterministic, independent of machine load) -------------------

async def _count_work(n: int) -> dict:
    """Run the app in this process against the fakes and count, per answered message, the
    round trips to the SQLite thread (aiosqlite), the SQL statements, and the HTTP calls."""
    import collections

    import aiosqlite

    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_lark import FakeLark
    from tests.harness import Harness

    hops: collections.Counter = collections.Counter()
    callers: collections.Counter = collections.Counter()
    stmts: collections.Counter = collections.Counter()
    original = aiosqlite.Connection._execute

    async def counting(self, fn, *args, **kwargs):
        hops[getattr(fn, "__name__", "?")] += 1
        callers[_caller()] += 1
        return await original(self, fn, *args, **kwargs)

    last = [""]

    def trace(sql: str) -> None:
        # Statements run by triggers / FTS5 are reported as comments, and each trigger program
        # also re-reports the statement that fired it: count neither.
        if not sql.startswith("--") and sql != last[0]:
            stmts[" ".join(sql.split()[:3])] += 1
        if not sql.startswith("--"):
            last[0] = sql

    lark, model = FakeLark(), FakeAnthropic()
    lark.start()
    model.start()
    model.on_tool("write_summary", {"summary": "用户和助手讨论了项目的预算和排期。"}, keys={"summary"})
    model.on_tool("extract_memories", {"facts": [{"content": "用户在做项目预算", "category": "knowledge",
                                                  "importance": 0.8}], "profile_psych": []},
                  keys={"facts", "profile_psych"})
    aiosqlite.Connection._execute = counting
    try:
        with tempfile.TemporaryDirectory(prefix="ethan-bench-count-") as d:
            async with Harness(Path(d), lark=lark, model=model) as h:
                conn = h.app.db.conn
                await conn._execute(lambda: conn._conn.set_trace_callback(trace))
                for i in range(3):                                    # warm: session exists, token cached
                    await h.send_text(f"warm-up message {i} about the project", chat_id="oc_p2p_count")
                await h.replies(3, timeout=30)
                await h.idle(30)
                hops.clear()
                callers.clear()
                stmts.clear()
                lark_calls, model_calls = len(lark.calls), len(model.requests)
                for i in range(n):
                    await h.send_text(f"{TEXTS[i % len(TEXTS)]} ({i})", chat_id="oc_p2p_count")
                    await h.replies(3 + i + 1, timeout=30)
                    await h.idle(30)
                paths = collections.Counter(_call_kind(c.method, c.path) for c in lark.calls[lark_calls:])
                return {"hops": dict(hops), "callers": dict(callers), "stmts": dict(stmts),
                        "lark": len(lark.calls) - lark_calls,
                        "model": len(model.requests) - model_calls, "lark_paths": dict(paths), "n": n}
    finally:
        aiosqlite.Connection._execute = original
        model.stop()
        lark.stop()


_STAGES = {   # function name -> the stage of a reply it stands for (innermost match wins)
    "gather": "agent: gather memory", "build_context": "agent: build_context",
    "append_user": "agent: store user message", "append_assistant": "agent: store answer",
    "respond": "agent: other", "_job": "consolidation queue (after each reply)",
    "lark_events": "webhook ack", "_flush": "webhook ack", "handle": "handler (inbox start/finish)",
    "context_and_view": "agent: build_context",
}
_HELPERS = {"_one", "_all", "_fetch", "_ensure_state"}


def _caller() -> tuple[str, str]:
    """(stage, innermost Ethan function) behind this SQLite round trip."""
    f = sys._getframe(2)
    inner, stage = "", ""
    while f is not None:
        fn, name = f.f_code.co_filename, f.f_code.co_name
        if ("/memory/" in fn or "/bot/" in fn) and "/storage/" not in fn and "/.venv/" not in fn:
            if not inner and name not in _HELPERS:
                inner = f"{fn.rsplit('/', 2)[-2]}/{fn.rsplit('/', 1)[-1].removesuffix('.py')}.{name}"
            if not stage and name in _STAGES:
                stage = _STAGES[name]
        f = f.f_back
    return stage or "other", inner or "?"


def _call_kind(method: str, path: str) -> str:
    if "/reactions" in path:
        return f"{method} reaction"
    if path.endswith("/reply"):
        return "reply"
    if "/cardkit/" in path:
        return f"{method} card"
    return f"{method} {path.rsplit('/', 1)[-1]}"


def _work_table(w: dict) -> list[str]:
    n = w["n"]
    hops = w["hops"]
    stmts = w["stmts"]
    total_hops = sum(hops.values())
    begin = stmts.get("BEGIN IMMEDIATE", 0)
    selects = sum(v for k, v in stmts.items() if k.upper().startswith("SELECT"))
    writes = sum(v for k, v in stmts.items() if k.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "REPLACE"))
    return [
        f"Work per answered message, counted with the app in-process (p2p, medium path, {n} messages in one "
        "session after 3 warm-up messages; consolidation included). Counts do not depend on machine load.",
        "",
        *table(["work", "per message"], [
            ("round trips to the SQLite thread (aiosqlite `_execute`)", f"{total_hops / n:.1f}"),
            ("… of which cursor `fetchone`/`fetchall`/`close` after an `execute`",
             f"{(hops.get('fetchone', 0) + hops.get('fetchall', 0) + hops.get('close', 0)) / n:.1f}"),
            ("SQL statements (not counting trigger bodies)", f"{sum(stmts.values()) / n:.1f}"),
            ("… SELECT / INSERT·UPDATE·DELETE / write transactions (BEGIN IMMEDIATE)",
             f"{selects / n:.1f} / {writes / n:.1f} / {begin / n:.1f}"),
            ("Open API calls to Lark", f"{w['lark'] / n:.1f} ("
             + ", ".join(f"{k} {v / n:g}" for k, v in sorted(w["lark_paths"].items())) + ")"),
            ("model requests (chat + consolidation)", f"{w['model'] / n:.1f}"),
        ]),
        "",
        "SQLite round trips per message, by stage of the reply and by the function that made them:",
        "",
        *table(["stage", "round trips per message"],
               [(k, f"{v / n:.1f}") for k, v in sorted(_sum_by(w["callers"], 0).items(), key=lambda kv: -kv[1])]),
        "",
        *table(["function (top 12)", "round trips per message"],
               [(f"`{k}`", f"{v / n:.1f}")
                for k, v in sorted(_sum_by(w["callers"], 1).items(), key=lambda kv: -kv[1])[:12]]),
    ]


def _sum_by(counts: dict, index: int) -> dict:
    out: dict = defaultdict(int)
    for key, v in counts.items():
        out[key[index]] += v
    return out


# ---- profile summary ----------------------------------------------------------------------

_AREAS = [
    ("Ethan: bot/", ("/bot/",)),
    ("Ethan: memory/", ("/memory/",)),
    ("HTTP client (httpx, httpcore, h11, anyio) — Lark + model calls",
     ("/httpx", "/httpcore", "/h11/", "/anyio/", "/sniffio/")),
    ("anthropic SDK (streaming parse, models)", ("/anthropic/",)),
    ("aiohttp server (webhook)", ("/aiohttp/", "/multidict/", "/yarl/")),
    ("aiosqlite hand-off to the SQLite thread", ("/aiosqlite/", "SimpleQueue")),
    ("logging (structlog)", ("/structlog/", "/logging/")),
    ("pydantic", ("/pydantic", "validate_python", "validate_json")),
    ("JSON", ("/json/", "json.decoder", "json.encoder")),
    ("crypto (AES, sha256)", ("/Crypto/", "/lark_oapi/", "hashlib", "_sha256")),
    ("asyncio event loop", ("/asyncio/", "/selectors.py")),
]


def _area(key: tuple) -> str:
    filename, _, func = key
    text = f"{filename}:{func}"
    if "poll' of 'select.epoll" in text:
        return "idle (epoll wait)"
    for name, needles in _AREAS:
        if any(n in text for n in needles):
            return name
    if filename == "~":
        if any(s in func for s in ("socket", "recv", "send")):
            return "sockets (send/recv)"
        return "builtins / C calls"
    return "other Python"


def _profile_summary(path: Path, messages: int) -> list[str]:
    st = pstats.Stats(str(path))
    stats = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values())
    by_area: dict[str, float] = defaultdict(float)
    for key, (_, _, tt, _, _) in stats.items():
        by_area[_area(key)] += tt
    busy = total - by_area.get("idle (epoll wait)", 0.0)
    lines = [
        f"Profile of the event loop thread (cProfile, on for the load only; profiling slows it "
        f"down, so read shares, not absolute times). Self time by area, {messages:,} messages:",
        "",
        *table(["area", "self time (s)", "share of busy time", "ms per message"],
               [(a, f"{t:.2f}", f"{100 * t / busy:.0f} %" if a != "idle (epoll wait)" else "—",
                 f"{1000 * t / messages:.2f}")
                for a, t in sorted(by_area.items(), key=lambda kv: -kv[1])]),
        "",
        "Ethan's functions by cumulative time (includes what they call, awaits excluded):",
        "",
    ]
    own = [(k, v) for k, v in stats.items()
           if str(ROOT) in k[0] and not any(x in k[0] for x in ("/tests/", "/bench/", "/.venv/", "site-packages"))
           and k[2] not in ("_drain", "__call__", "handle")]
    own.sort(key=lambda kv: -kv[1][3])
    rows = []
    for (fn, line, func), (cc, nc, tt, ct, _) in own[:15]:
        rel = fn.replace(str(ROOT) + "/", "")
        rows.append((f"`{rel}:{line} {func}`", f"{nc:,}", f"{ct:.2f}", f"{1000 * ct / messages:.2f}"))
    lines += table(["function", "calls", "cumulative (s)", "ms per message"], rows)
    lines += ["", "Top functions by self time (excluding the epoll wait):", ""]
    top = sorted(((k, v) for k, v in stats.items() if _area(k) != "idle (epoll wait)"),
                 key=lambda kv: -kv[1][2])[:12]
    rows = []
    for (fn, line, func), (cc, nc, tt, ct, _) in top:
        where = fn.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        where = f"{where}:{line} {func}" if fn != "~" else func
        rows.append((f"`{where[-90:]}`", f"{nc:,}", f"{tt:.2f}", f"{1000 * tt / messages:.3f}"))
    lines += table(["function", "calls", "self (s)", "ms per message"], rows)
    return lines


# ---- the cost trap: lark-oapi's per-call client vs a pooled client ---------------------------

_FAKE_LARK_PROC = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.fakes.fake_lark import FakeLark
lark = FakeLark().start()
print(lark.port, flush=True)
sys.stdin.read()
lark.stop()
"""


async def _send_costs(base_url: str, n: int) -> list[tuple[str, float, float]]:
    import lark_oapi as lark
    from lark_oapi.api.im.v1 import ReplyMessageRequest, ReplyMessageRequestBody

    from bot.lark.openapi.client import OpenApi
    from bot.lark.outbound import LarkSender

    content = json.dumps({"text": "这是一条回复 — a reply of ordinary length."}, ensure_ascii=False)
    results: list[tuple[str, float, float]] = []

    async def measure(name: str, send) -> None:
        for i in range(5):                      # warm: token fetch, imports, first connection
            await send(f"warm{i}")
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            await send(str(i))
        results.append((name, (time.process_time() - c0) / n, (time.perf_counter() - t0) / n))

    client = lark.Client.builder().app_id(APP_ID).app_secret(APP_SECRET).domain(base_url) \
        .log_level(lark.LogLevel.ERROR).build()

    async def oapi(i: str) -> None:
        req = ReplyMessageRequest.builder().message_id(f"om_cost_a{i}").request_body(
            ReplyMessageRequestBody.builder().msg_type("text").content(content).uuid(f"a-{i}").build()).build()
        resp = await client.im.v1.message.areply(req)
        assert resp.success(), resp.msg

    await measure("lark-oapi `Client.im.v1.message.areply` (new httpx.AsyncClient per call)", oapi)

    api = OpenApi(APP_ID, APP_SECRET, base_url)
    try:
        async def pooled(i: str) -> None:
            await api.request("POST", f"/open-apis/im/v1/messages/om_cost_b{i}/reply",
                              json={"content": content, "msg_type": "text", "uuid": f"b-{i}"})

        await measure("Ethan `OpenApi.request` (one pooled aiohttp.ClientSession)", pooled)
        sender = LarkSender(api)

        async def ours(i: str) -> None:
            await sender.reply(f"om_cost_c{i}", "text", {"text": "x"}, uuid=f"c-{i}", chat_id=f"oc_cost_{i}")

        await measure("Ethan `LarkSender.reply` (+ uuid, per-chat rate limiter, retry policy)", ours)
    finally:
        await api.aclose()

    import aiohttp

    async with aiohttp.ClientSession() as session:
        token = (await (await session.post(base_url + "/open-apis/auth/v3/tenant_access_token/internal",
                                           json={"app_id": APP_ID, "app_secret": APP_SECRET})).json())[
            "tenant_access_token"]

        async def raw(i: str) -> None:
            async with session.post(base_url + f"/open-apis/im/v1/messages/om_cost_d{i}/reply",
                                    json={"content": content, "msg_type": "text", "uuid": f"d-{i}"},
                                    headers={"Authorization": f"Bearer {token}"}) as r:
                await r.json()

        await measure("reference: one `aiohttp.ClientSession` (raw POST, no retry logic)", raw)
    return results


def _cost_trap(n: int) -> list[tuple[str, float, float]]:
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_LARK_PROC, str(ROOT)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        port = int(proc.stdout.readline())
        from tests.fakes.fake_lark import reset_lark_sdk_token_cache

        reset_lark_sdk_token_cache()
        return asyncio.run(_send_costs(f"http://127.0.0.1:{port}", n))
    finally:
        proc.stdin.close()
        proc.wait(10)


# ---- run ----------------------------------------------------------------------------------------

def run(quick: bool = False) -> list[str]:
    convs, per_conv, conc = (50, 2, 20) if quick else (200, 3, 50)
    sends = 30 if quick else 200
    runs = [_e2e(convs, per_conv, conc, None) for _ in range(1 if quick else 5)]
    runs.sort(key=lambda x: x["delivered"] / x["wall"])
    r = runs[len(runs) // 2]                   # the median run by messages per second
    n = r["delivered"]
    rate = n / r["wall"]
    cpu_ms = 1000 * r["cpu"] / max(n, 1)
    loop_ms = 1000 * r["loop_cpu"] / max(n, 1)
    lines = [
        "### 2. End-to-end throughput",
        "",
        (f"Median of {len(runs)} runs (by messages per second; the others: "
         + ", ".join(f"{x['delivered'] / x['wall']:.0f} msg/s at {1000 * x['cpu'] / max(x['delivered'], 1):.1f} "
                     "CPU ms/msg" for x in runs if x is not r) + "). " if len(runs) > 1 else "")
        + f"{convs} conversations × {per_conv} messages = {r['messages']:,} signed, encrypted events posted "
        f"at concurrency {conc} to `/lark/events` of `python -m bot serve` (subprocess); clock stops when "
        "the fake Lark has received every reply. Zero-latency fake model (streamed answer); each reply "
        "is one Open API call (the Typing reaction is only added to answers slower than 1 s). Server CPU "
        "from /proc; the fakes and the load generator run on the same 2 cores (last rows).",
        "",
        *table(["measure", "value"], [
            ("messages answered", f"{n:,} of {r['messages']:,}" + (f" ({r['bad']} non-200 acks)" if r["bad"] else "")),
            ("wall time (s)", f"{r['wall']:.1f}"),
            ("**messages per second**", f"**{rate:.0f}** (target ≥ {TARGET_MSGS_PER_S}: "
                                        f"{'met' if rate >= TARGET_MSGS_PER_S else 'NOT met'})"),
            ("**server CPU ms per message** (all threads)", f"**{cpu_ms:.2f}**"),
            ("… event loop thread", f"{loop_ms:.2f}"),
            ("… other threads (SQLite, resolver)", f"{cpu_ms - loop_ms:.2f}"),
            ("CPU-bound ceiling on one event loop (1000 / loop ms)", f"{1000 / max(loop_ms, 1e-9):.0f} msg/s"),
            ("ack p50 / p99 (ms)", f"{ms(median(r['acks']))} / {ms(percentile(r['acks'], 99))}"),
            ("post → reply delivered p50 / p99 (ms)",
             f"{ms(median(r['replies']))} / {ms(percentile(r['replies'], 99))}"),
            ("fake Lark + fake model CPU ms per message (benchmark process)", f"{1000 * r['fakes_cpu'] / max(n, 1):.2f}"),
            ("load generator CPU ms per message (its own process)", f"{1000 * r['load_cpu'] / max(n, 1):.2f}"),
        ]),
        "",
    ]
    lines += _work_table(asyncio.run(_count_work(3 if quick else 20))) + [""]
    if quick:
        lines += ["(Profile skipped in quick mode.)", ""]
    else:
        with tempfile.TemporaryDirectory(prefix="ethan-prof-") as d:
            prof = Path(d) / "server.prof"
            p = _e2e(convs, per_conv, conc, prof)
            lines += _profile_summary(prof, p["delivered"]) + [""]
    costs = _cost_trap(sends)
    base = costs[0][1]
    pooled = costs[1][1]
    lines += [
        "Baseline — the DESIGN §5 cost trap: CPU per Open API reply sent, client side only (the fake "
        f"Lark runs in another process), {sends} sequential sends each after 5 warm-up sends:",
        "",
        *table(["client", "CPU ms per send", "wall ms per send", "CPU vs Ethan pooled"],
               [(name, f"{cpu * 1000:.2f}", f"{wall * 1000:.2f}", ratio(cpu, pooled)) for name, cpu, wall in costs]),
        "",
        f"lark-oapi's per-call client costs **{ratio(base, pooled)}** the CPU of the pooled client per send "
        "(over plain HTTP; against the real HTTPS Open API it also pays a TLS handshake per call).",
    ]
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
