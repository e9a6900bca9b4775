"""PostgreSQL vs SQLite, one run side by side: end-to-end throughput (signed, encrypted events
posted to ``/lark/events`` until the fake Lark has every reply, zero-latency fake model) and
server CPU per message — Ethan's process, plus on PostgreSQL the cluster's own processes —
for SQLite, PostgreSQL with one replica, and PostgreSQL with two replicas (the events split
between them), in interleaved rounds. Then the whole context assembly of bench_context (mode,
facts, profile, procedures, episodes, working memory; medium and full path) p50 at 10k facts,
on SQLite and on PostgreSQL.

The cluster is a throwaway one (tests/pg_cluster.py: initdb in a temp folder, fsync off
as in the tests — the comparison is of CPU and round trips, not of disks).

    python -m bench.bench_pg [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import CLK_TCK, median, temp_home  # noqa: E402
from tests.pg_cluster import INSTALL_HINT, Cluster, find_bindir  # noqa: E402


def _cluster_cpu(cluster: Cluster) -> float:
    """CPU seconds of this cluster's processes: the postmaster and its children (backends)."""
    pm = int((cluster.data / "postmaster.pid").read_text().split()[0])
    total = 0.0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(p.name) == pm or int(fields[1]) == pm:
            # utime + stime (+ cutime + cstime of exited backends, counted by the postmaster)
            total += sum(int(f) for f in fields[11:15]) / CLK_TCK if int(p.name) == pm else \
                (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def _run(convs: int, per_conv: int, conc: int, cluster: Cluster | None, replicas: int) -> dict:
    """One throughput run, the database next door (bench_scale's run, no delay, no lock sampler)."""
    from bench.bench_scale import _run_once     # here: bench_scale imports this module

    return _run_once(convs, per_conv, conc, cluster, replicas, 0.0, sample_locks=False)


async def _assembly(target: str, n_facts: int, reps: int, budget: float) -> dict[str, Any]:
    """bench_context's whole context assembly (mode + ``Agent.gather`` + ``build_system`` +
    ``WorkingMemory.build_context``, medium and full path) for a user with ``n_facts`` facts and
    the same seeded session, rules, profile and episodes, on either backend; and ``facts.top``
    alone. Unlike bench_context, no background of other users' messages."""
    import datetime as dt
    import random

    from bench.bench_context import FULL_TEXT, MEDIUM_TEXT, SEED, TextPool, _seed_user, _time
    from bot.agent.agent import Agent, Memory
    from bot.agent.prompt import build_system
    from storage import database
    from memory.episodes.store import EpisodeStore
    from memory.text.tokenizer import warm_up
    from memory.facts.store import CATEGORIES, FactStore
    from memory.profile.modes import ModeStore
    from memory.procedures import ProcedureStore
    from memory.profile.store import ProfileStore
    from memory.sessions.store import SessionStore
    from memory.working.view import WorkingMemory

    await asyncio.to_thread(warm_up)
    rng = random.Random(SEED)
    text = TextPool(rng, 2000)
    db = await database(target).open()
    try:
        user = f"ou_ctx_{n_facts}"
        now = time.time()
        rows = []
        for i in range(n_facts):
            content = f"{rng.choice(('数据库迁移', '季度预算', '飞书机器人', '发布排期'))}：{text()[:80]} #{i}"
            t = now - rng.uniform(0, 365 * 86400)
            rows.append((user, content, content.lower(), rng.choice(CATEGORIES), round(rng.uniform(0.2, 1.0), 3),
                         "consolidator", "private", f"oc_p2p_{user}", "", t, t, t + rng.uniform(0, 86400), 0))
        await db.executemany(
            "INSERT INTO facts(user_id, content, norm, category, confidence, source, visibility, chat_id,"
            " message_id, created_at, updated_at, last_accessed, hit_count) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        await db.execute("ANALYZE")
        sessions = SessionStore(db)
        working = WorkingMemory(db, sessions)
        memory = Memory(db=db, sessions=sessions, working=working, facts=FactStore(db),
                        procedures=ProcedureStore(db), profile=ProfileStore(db), episodes=EpisodeStore(db),
                        modes=ModeStore(db), queue=None)
        agent = Agent(memory, model=None)  # type: ignore[arg-type]
        scope, sid, current = await _seed_user(db, user, rng, text)
        today = dt.date.today().isoformat()

        def assemble(message: str):
            async def go() -> None:
                mode = await memory.modes.get(scope.user_id, scope.conv_key)
                blocks = await agent.gather(scope, message, session_id=sid, mode=mode)
                build_system(blocks, today=today)
                await working.build_context(sid, message, before_message_id=current)
            return go

        async def without_recall() -> None:
            # Agent.gather's reads but episode recall, then the same prompt and context
            mode = await memory.modes.get(scope.user_id, scope.conv_key)
            await memory.procedures.for_request(scope)
            await memory.profile.for_prompt(scope)
            await memory.facts.top(scope, k=15)
            await working.view(sid)
            await working.build_context(sid, MEDIUM_TEXT, before_message_id=current)
            del mode

        out: dict[str, Any] = {}
        out["no_recall"] = median(await _time(without_recall, reps, budget)) * 1000
        out["top"] = median(await _time(lambda: memory.facts.top(scope, k=15), reps, budget / 2)) * 1000
        for name, message in (("medium", MEDIUM_TEXT), ("full", FULL_TEXT)):
            try:    # both paths recall episodes: not every backend searches them yet
                out[name] = median(await _time(assemble(message), reps, budget)) * 1000
            except Exception as e:  # noqa: BLE001 - reported in the table instead
                out[name] = f"— ({type(e).__name__}: no episode search)"
        return out

    finally:
        await db.close()


def run(quick: bool = False) -> list[str]:
    bindir = find_bindir()
    if bindir is None:
        return [INSTALL_HINT]
    convs, per_conv, conc = (40, 2, 20) if quick else (150, 3, 40)
    cluster = Cluster(bindir).start()
    try:
        cluster.migrated_template()
        rounds = 1 if quick else 3
        out: dict[str, list[dict]] = {"sqlite": [], "pg": [], "pg×2": []}
        for _ in range(rounds):        # interleaved, so machine load hits each alike
            out["sqlite"].append(_run(convs, per_conv, conc, None, 1))
            out["pg"].append(_run(convs, per_conv, conc, cluster, 1))
            out["pg×2"].append(_run(convs, per_conv, conc, cluster, 2))
        lines = ["### 11. PostgreSQL vs SQLite", "",
                 "| backend | messages | msg/s (median) | Ethan CPU ms/msg | PostgreSQL CPU ms/msg | non-200 |",
                 "|---|---|---|---|---|---|"]
        rate = {}
        for name, runs in out.items():
            rate[name] = median([r["delivered"] / r["wall"] for r in runs])
            cpu = median([r["cpu"] / r["messages"] * 1000 for r in runs])
            pg = median([r["pg_cpu"] / r["messages"] * 1000 for r in runs])
            lines.append(f"| {name} | {runs[0]['messages']} | {rate[name]:.0f} | {cpu:.2f} | {pg:.2f} | "
                         f"{sum(r['bad'] for r in runs)} |")
        lines += ["", f"PostgreSQL (one replica) / SQLite: {rate['pg'] / rate['sqlite']:.2f}× (target ≥ 0.6×); "
                      f"two replicas / one: {rate['pg×2'] / rate['pg']:.2f}×", ""]
        print("\n".join(lines), file=sys.stderr, flush=True)   # in case the part below fails
        reps, budget = (60, 1.0) if quick else (400, 4.0)
        with temp_home("ethan-bench-ctx-") as home:
            ctx = {"sqlite": asyncio.run(_assembly(str(home / "ethan.db"), 10_000, reps, budget)),
                   "pg": asyncio.run(_assembly(cluster.new_database(), 10_000, reps, budget))}
        lines += ["Context assembly at 10k facts, p50 ms (target < 5 ms on PostgreSQL):", "",
                  "| backend | medium path | full path | all but episode recall | `facts.top` alone |",
                  "|---|---|---|---|---|"]
        cell = lambda v: v if isinstance(v, str) else f"{v:.2f}"  # noqa: E731
        for name, c in ctx.items():
            lines.append(f"| {name} | {cell(c['medium'])} | {cell(c['full'])} | {cell(c['no_recall'])} | "
                         f"{cell(c['top'])} |")
        lines.append("")
        return lines
    finally:
        cluster.stop()


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
