"""Scaling out (issue 29): messages per second for 1, 2 and 3 replicas on one PostgreSQL, with
the database next door (0 ms) and as if on another host (2 ms added per round trip, through the
loopback delay proxy of tests/delay_proxy.py, 1 ms each way), and SQLite's one process at 0 ms —
all in one run, interleaved rounds so machine load hits each alike. Plus, per PostgreSQL row,
the share of time the units spend waiting on locks: ``pg_stat_activity`` sampled every 5 ms,
(backends of Ethan's database waiting on a heavyweight lock — advisory, row, transaction id) /
(backends of it inside a statement or an open transaction). The sampler runs in a round of its
own after the timed ones: 200 queries a second, from a thread of the process that also runs the
load and the fakes, cost the PostgreSQL rows CPU the SQLite row never paid (the timed rounds'
msg/s and CPU are measured without it).

The load: signed, encrypted events posted to ``/lark/events`` for many conversations (a sticky
balancer: conversation c goes to replica c mod n), zero-latency fake model, until the fake Lark
has every reply. Each replica is a ``python -m bot serve`` of its own; PostgreSQL is a throwaway
cluster (tests/pg_cluster.py, fsync off: CPU and round trips are compared, not disks).

    python -m bench.bench_scale [--quick]      # or: python -m bench scale
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_pg import _cluster_cpu  # noqa: E402
from bench.bench_throughput import _requests  # noqa: E402
from bench.common import Fakes, Server, median, post_all, signed_request, temp_home  # noqa: E402
from tests.delay_proxy import DelayProxyProcess  # noqa: E402
from tests.pg_cluster import INSTALL_HINT, Cluster, find_bindir  # noqa: E402

SAMPLE_S = 0.005


class LockSampler:
    """``pg_stat_activity`` every 5 ms: of the backends of ``dbname`` busy in a unit (running a
    statement, or in an open transaction), how many wait on a lock."""

    def __init__(self, cluster: Cluster, dbname: str) -> None:
        import psycopg
        self.conn = psycopg.connect(cluster.url(), autocommit=True)
        self.dbname = dbname
        self.busy = self.waiting = 0
        self.kinds: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-sampler", daemon=True)

    def start(self) -> "LockSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            rows = self.conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE datname = %s"
                " AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')",
                (self.dbname,)).fetchall()
            self.busy += len(rows)
            for kind, event in rows:
                if kind == "Lock":
                    self.waiting += 1
                    self.kinds[event] = self.kinds.get(event, 0) + 1

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(5)
        self.conn.close()
        return self.waiting / self.busy if self.busy else 0.0


def _run_once(convs: int, per_conv: int, conc: int, cluster: Cluster | None, replicas: int,
              one_way: float, *, sample_locks: bool = True, proxied: bool = False) -> dict:
    """``proxied``: through the delay proxy even at ``one_way`` 0 (the proxy's own cost, for
    the reference of the latency alone)."""
    with temp_home("ethan-bench-scale-") as home, Fakes() as fakes:
        env, proxy, sampler = {}, None, None
        if cluster is not None:
            url = cluster.new_database()
            dbname = url.rsplit("/", 1)[1]
            if one_way > 0 or proxied:
                proxy = DelayProxyProcess(cluster.port, one_way)
                url = proxy.through(url)
            env["ETHAN_DATABASE_URL"] = url
        for i in range(replicas):
            (home / f"r{i}").mkdir()
        servers = [Server(home / f"r{i}", fakes, **env).launch() for i in range(replicas)]
        try:
            for s in servers:
                s.wait_healthy(90)
            for i, s in enumerate(servers):
                warm = [signed_request("hello", chat_id=f"oc_p2p_warm{i}", sender=f"ou_warm{i}")]
                asyncio.run(post_all(s.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(replicas, 60)
            reqs = _requests(convs, per_conv)
            shares = [[r for j, r in enumerate(reqs) if (j // per_conv) % replicas == i] for i in range(replicas)]
            trips0 = [s.metric("ethan_database_work", kind="round_trips") for s in servers]
            cpu0 = [s.cpu_seconds() for s in servers]
            pg0 = _cluster_cpu(cluster) if cluster else 0.0
            if cluster is not None and sample_locks:
                sampler = LockSampler(cluster, dbname).start()
            t0 = time.monotonic()

            async def load():
                return await asyncio.gather(*(post_all(s.url + "/lark/events", share, max(1, conc // replicas))
                                              for s, share in zip(servers, shares)))
            results = asyncio.run(load())
            got = fakes.lark.wait_delivered(len(reqs) + replicas, 300) - replicas
            wall = time.monotonic() - t0
            lock_share = sampler.stop() if sampler else 0.0
            cpu = sum(s.cpu_seconds() - c for s, c in zip(servers, cpu0))
            trips = sum(s.metric("ethan_database_work", kind="round_trips") - t for s, t in zip(servers, trips0))
            pg = (_cluster_cpu(cluster) - pg0) if cluster else 0.0
            bad = sum(1 for _, statuses in results for st in statuses if st != 200)
            return {"messages": len(reqs), "delivered": got, "wall": wall, "cpu": cpu, "pg_cpu": pg, "trips": trips,
                    "bad": bad, "lock_share": lock_share,
                    "lock_kinds": dict(sampler.kinds) if sampler else {}}
        finally:
            for s in servers:
                s.stop()
            if proxy is not None:
                proxy.close()


QUICK_CONFIGS = [("SQLite", "sqlite", 1, 0, False), ("PostgreSQL", "pg", 1, 0, False), ("PostgreSQL", "pg", 2, 0, False),
                 ("PostgreSQL", "pg", 1, 2, True)]   # the suite's run: one of each kind, few server starts
CONFIGS = [  # (label, backend, replicas, added round trip ms, through the delay proxy)
    ("SQLite", "sqlite", 1, 0, False), ("PostgreSQL", "pg", 1, 0, False), ("PostgreSQL", "pg", 2, 0, False),
    ("PostgreSQL", "pg", 3, 0, False), ("PostgreSQL", "pg", 1, 0, True),
    ("PostgreSQL", "pg", 1, 2, True), ("PostgreSQL", "pg", 2, 2, True), ("PostgreSQL", "pg", 3, 2, True),
]


def run(quick: bool = False) -> list[str]:
    bindir = find_bindir()
    if bindir is None:
        return [INSTALL_HINT]
    convs, per_conv, conc = (20, 2, 16) if quick else (500, 2, 48)
    rounds = 1 if quick else 3
    configs = QUICK_CONFIGS if quick else CONFIGS
    cluster = Cluster(bindir).start()
    try:
        cluster.migrated_template()
        out: dict[tuple, list[dict]] = {c: [] for c in configs}
        for _ in range(rounds):     # interleaved
            for c in configs:
                _, backend, n, rtt, proxied = c
                out[c].append(_run_once(convs, per_conv, conc, cluster if backend == "pg" else None, n,
                                        rtt / 2000, proxied=proxied, sample_locks=False))
        locks = {c: _run_once(convs, per_conv, conc, cluster, c[2], c[3] / 2000, proxied=c[4])
                 for c in configs if c[1] == "pg"}     # the lock-wait round: not timed
    finally:
        cluster.stop()
    rate = {c: median([r["delivered"] / r["wall"] for r in runs]) for c, runs in out.items()}
    lines = ["### 16. Scaling out: replicas × database round trip", "",
             f"{convs * per_conv} messages per run, {convs} conversations, {conc} requests in flight, "
             f"median of {rounds} interleaved round(s) (the lock-wait share from one more round, "
             "sampled: the sampler's own cost is kept out of the timed rounds); this machine's cores are shared by every replica, "
             "the delay proxy (a process of its own) and PostgreSQL. \"via proxy\": through the delay "
             "proxy with nothing added — what the proxy itself costs the machine, so that its 2 ms "
             "rows compare the latency alone.", "",
             "| backend | replicas | added round trip | msg/s | Ethan CPU ms/msg | PostgreSQL CPU ms/msg "
             "| round trips/msg | lock-wait share | non-200 |", "|---|---|---|---|---|---|---|---|---|"]
    for c, runs in out.items():
        label, backend, n, rtt, proxied = c
        where = f"{rtt} ms" + (" via proxy" if proxied and not rtt else "")
        cpu = median([r["cpu"] / r["messages"] * 1000 for r in runs])
        pg = median([r["pg_cpu"] / r["messages"] * 1000 for r in runs])
        share = locks[c]["lock_share"] if c in locks else 0.0
        trips = median([r["trips"] / r["messages"] for r in runs])
        lines.append(f"| {label} | {n} | {where} | {rate[c]:.0f} | {cpu:.2f} | "
                     f"{pg:.2f} | {trips:.1f} | {share * 100:.1f} % | {sum(r['bad'] for r in runs)} |"
                     if backend == "pg" else
                     f"| {label} | {n} | {where} | {rate[c]:.0f} | {cpu:.2f} | — | — | — | {sum(r['bad'] for r in runs)} |")
    # (replicas, added ms) -> msg/s; the proxied 0 ms row is "p0"
    pg = {(n, "p0" if proxied and not rtt else rtt): rate[c] for c in configs
          for _, b, n, rtt, proxied in [c] if b == "pg"}
    sqlite = rate[configs[0]]

    def verdict(value: float, target: float) -> str:
        return f"{value:.2f}× (target ≥ {target}×: {'met' if value >= target else 'NOT met'})"
    kinds: dict[str, int] = {}
    for r in locks.values():
        for k, v in r["lock_kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    lines += ["",
              f"- latency hidden — one replica at 2 ms / its own 0 ms: {verdict(pg[1, 2] / pg[1, 0], 0.8)}"
              + (f"; / 0 ms via the proxy (the latency alone, without the proxy's CPU): "
                 f"{pg[1, 2] / pg[1, 'p0']:.2f}×" if (1, "p0") in pg else ""),
              f"- no lock convoy — 2 replicas / 1 at 0 ms: {verdict(pg[2, 0] / pg[1, 0], 1.0)}"
              + (f"; at 2 ms: {verdict(pg[2, 2] / pg[1, 2], 1.0)}; 3 replicas / 1 at 0 ms: "
                 f"{pg[3, 0] / pg[1, 0]:.2f}×, at 2 ms: {pg[3, 2] / pg[1, 2]:.2f}×" if (3, 2) in pg else ""),
              f"- PostgreSQL one replica / SQLite at 0 ms: {verdict(pg[1, 0] / sqlite, 0.8)}",
              f"- lock waits seen, by kind (samples): {kinds or 'none'}", ""]
    return lines


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
