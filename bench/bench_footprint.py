"""Memory footprint: resident memory (VmRSS from /proc/<pid>/status) of the server idle and
after 10,000 conversations of one message each (zero-latency fake model).

The server runs in a subprocess (``python -m bot serve``). RSS is read after start, after
the first message (which loads what is loaded lazily), and after every batch of
conversations once all its replies have reached the fake Lark. Baseline: the idle server;
the result is reported as growth per 1,000 conversations. Python's allocator rarely returns
memory to the OS, so RSS is a high-water mark: growth that continues batch after batch is a
leak or an unbounded cache, a step at the start is working set.

    python -m bench.bench_footprint [--quick]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Fakes, Server, post_all, signed_request, table, temp_home  # noqa: E402

CONCURRENCY = 50
# Posting stops early when the next batch would not fit in this budget (the benchmark must
# finish within 3 minutes; at the product's current throughput 10,000 may not fit).
BUDGET_S = 135.0


def _settled_rss(server: Server, limit: float, step: float = 1.0) -> int:
    """RSS once start-up work in the background (jieba's dictionary) is done: when it has not
    moved by more than 1 MiB for ``step`` seconds (or after ``limit`` seconds)."""
    end = time.monotonic() + limit
    last = server.rss_kib()
    while time.monotonic() < end:
        time.sleep(step)
        now = server.rss_kib()
        if abs(now - last) < 1024:
            return now
        last = now
    return last


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.1f}"


def run(quick: bool = False) -> list[str]:
    checkpoints = [100, 200] if quick else [1_000, 2_500, 5_000, 10_000]
    budget = 30.0 if quick else BUDGET_S
    rows = []
    with temp_home("ethan-bench-rss-") as home, Fakes() as fakes:
        fakes.lark.keep_calls = False          # the fake keeps no request log for 10k conversations
        server = Server(home, fakes).start()
        try:
            started = _settled_rss(server, *((5.0, 0.5) if quick else (20.0, 1.0)))
            warm = [signed_request("hello", chat_id="oc_p2p_rss_warm", sender="ou_rss_warm")]
            asyncio.run(post_all(server.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(1, 30)
            time.sleep(0.5)
            idle = server.rss_kib()
            rows.append(("started, idle (**baseline**)", "0", _mib(started), "—", "—", "—"))
            rows.append(("after the first message", "1", _mib(idle), _mib(idle - started), "—", "—"))
            done, t0 = 0, time.monotonic()
            prev_rss, prev_n = idle, 0
            cut = ""
            first_batch: tuple[int, int] | None = None
            for target in checkpoints:
                elapsed = time.monotonic() - t0
                if done:
                    rate = done / elapsed
                    if elapsed + (target - done) / rate > budget:
                        fit = done + int(max(0.0, budget - elapsed) * rate) // 500 * 500
                        if fit <= done:
                            cut = f" Stopped at {done:,}: the next batch would not fit the {budget:.0f} s budget."
                            break
                        cut = (f" Stopped at {fit:,} of {checkpoints[-1]:,}: at {rate:.0f} conversations/s "
                               f"the rest would not fit the {budget:.0f} s budget.")
                        target = fit
                reqs = [signed_request(f"你好，我是第 {i} 位用户，想问问这周的安排",
                                       chat_id=f"oc_p2p_rss_{i}", sender=f"ou_rss_{i}")
                        for i in range(done, target)]
                asyncio.run(post_all(server.url + "/lark/events", reqs, CONCURRENCY))
                got = fakes.lark.wait_delivered(target + 1, 600) - 1
                time.sleep(0.3)
                rss = server.rss_kib()
                step_k = (rss - prev_rss) / ((target - prev_n) / 1000)
                db_mib = sum(p.stat().st_size for p in home.glob("ethan.db*")) / 1024 / 1024
                rows.append((f"after {target:,} conversations", f"{got:,}", _mib(rss), f"{_mib(rss - started)}",
                             f"{step_k / 1024:,.2f}", f"{db_mib:,.1f}"))
                if first_batch is None:
                    first_batch = (target, rss)
                prev_rss, prev_n, done = rss, target, target
                if cut:
                    break
            elapsed = time.monotonic() - t0
        finally:
            server.stop()
    steady = ""
    if first_batch is not None and done > first_batch[0]:
        per_k = (prev_rss - first_batch[1]) / ((done - first_batch[0]) / 1000) / 1024
        steady = (f"; steady growth from {first_batch[0]:,} to {done:,} conversations: "
                  f"**{per_k:.2f} MiB per 1,000 conversations**")
    return [
        "### 7. Memory footprint",
        "",
        f"`python -m bot serve` in a subprocess; new p2p conversations of one message each, posted at concurrency "
        f"{CONCURRENCY}, zero-latency fake model; VmRSS once every reply of a batch was delivered. "
        f"{done:,} conversations took {elapsed:.0f} s ({done / elapsed:.0f}/s).{cut} Baseline: the idle "
        "server (after start-up work in the background settled).",
        "",
        *table(["server state", "replies", "RSS (MiB)", "growth over idle (MiB)",
                "growth per 1k conversations since the row above (MiB)", "database on disk (MiB)"], rows),
        "",
        f"Idle: **{_mib(started)} MiB**; the first message adds **{_mib(idle - started)} MiB** once (what is "
        f"imported or loaded lazily){steady}; {_mib(prev_rss - started)} MiB over idle after {done:,} "
        f"({(prev_rss - started) / 1024 / (done / 1000):.1f} MiB per 1,000 on average, one-time growth included). "
        "Python's allocator seldom returns memory to the OS, so RSS is a high-water mark.",
    ]


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
