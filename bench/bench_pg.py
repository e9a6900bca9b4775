"""PostgreSQL vs SQLite, one run side by side: end-to-end throughput (signed, encrypted events
posted to ``/lark/events`` until the fake Lark has every reply, zero-latency fake model) and
server CPU per message — Ethan's process, plus on PostgreSQL the cluster's own processes —
for SQLite, PostgreSQL with one replica, and PostgreSQL with two replicas (the events split
between them). Then context assembly (facts + profile + procedures + episodes for a prompt)
p50 at 10k facts on PostgreSQL.

The cluster is a throwaway one (tests/pg_cluster.py: initdb in a temp folder, fsync off
as in the tests — the comparison is of CPU and round trips, not of disks).

    python -m bench.bench_pg [--quick]
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_throughput import _requests  # noqa: E402
from bench.common import CLK_TCK, Fakes, Server, median, post_all, signed_request, temp_home  # noqa: E402
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
    with temp_home() as home, Fakes() as fakes:
        env = {}
        if cluster is not None:
            env["ETHAN_DATABASE_URL"] = cluster.new_database()
        for i in range(replicas):
            (home / f"r{i}").mkdir()
        servers = [Server(home / f"r{i}", fakes, **env).start() for i in range(replicas)]
        try:
            for i, s in enumerate(servers):
                warm = [signed_request("hello", chat_id=f"oc_p2p_warm{i}", sender=f"ou_warm{i}")]
                asyncio.run(post_all(s.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(replicas, 30)
            reqs = _requests(convs, per_conv)
            # Replica i gets conversation c's events when c % replicas == i (a sticky balancer).
            shares = [[r for j, r in enumerate(reqs) if (j // per_conv) % replicas == i] for i in range(replicas)]
            cpu0 = [s.cpu_seconds() for s in servers]
            pg0 = _cluster_cpu(cluster) if cluster else 0.0
            t0 = time.monotonic()

            async def load():
                return await asyncio.gather(*(post_all(s.url + "/lark/events", share, max(1, conc // replicas))
                                              for s, share in zip(servers, shares)))
            results = asyncio.run(load())
            got = fakes.lark.wait_delivered(len(reqs) + replicas, 300) - replicas
            wall = time.monotonic() - t0
            cpu = sum(s.cpu_seconds() - c for s, c in zip(servers, cpu0))
            pg = (_cluster_cpu(cluster) - pg0) if cluster else 0.0
            bad = sum(1 for _, statuses in results for st in statuses if st != 200)
            return {"messages": len(reqs), "delivered": got, "wall": wall, "cpu": cpu, "pg_cpu": pg, "bad": bad}
        finally:
            for s in servers:
                s.stop()


async def _context_p50(url: str, n_facts: int, samples: int) -> float:
    from memory.db import database
    from memory.facts import FactStore
    from memory.scope import Scope
    db = await database(url).open()
    try:
        now = time.time()
        rows = [("ou_ctx", f"事实 {i} fact number {i}", f"norm {i}", "knowledge", 0.5 + (i % 50) / 100,
                 "consolidator", "private", "oc_dm", "", now, now, now - i) for i in range(n_facts)]
        await db.executemany(
            "INSERT INTO facts(user_id, content, norm, category, confidence, source, visibility, chat_id,"
            " message_id, created_at, updated_at, last_accessed) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        await db.execute("ANALYZE facts")
        facts = FactStore(db)
        scope = Scope(user_id="ou_ctx", chat_id="oc_dm", chat_type="p2p")
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            await facts.top(scope)
            times.append(time.perf_counter() - t)
        return median(times) * 1000
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
        p50 = asyncio.run(_context_p50(cluster.new_database(), 10_000, 50 if quick else 300))
        lines += [f"facts.top() at 10k facts on PostgreSQL: p50 {p50:.2f} ms (target < 5 ms)", ""]
        return lines
    finally:
        cluster.stop()


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
