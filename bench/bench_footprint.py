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
BUDGET_S = 130.0


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
            time.sleep(0.3 if quick else 1.0)
            started = server.rss_kib()
            warm = [signed_request("hello", chat_id="oc_p2p_rss_warm", sender="ou_rss_warm")]
            asyncio.run(post_all(server.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(1, 30)
            time.sleep(0.5)
            idle = server.rss_kib()
            rows.append(("just started (idle)", "0", _mib(started), "—", "—", "—"))
            rows.append(("after the first message (**baseline**)", "1", _mib(idle), "—", "—", "—"))
            done, t0 = 0, time.monotonic()
            prev_rss, prev_n = idle, 0
            cut = ""
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
                per_k = (rss - idle) / (target / 1000)
                step_k = (rss - prev_rss) / ((target - prev_n) / 1000)
                db_mib = sum(p.stat().st_size for p in home.glob("ethan.db*")) / 1024 / 1024
                rows.append((f"after {target:,} conversations", f"{got:,}", _mib(rss), f"{_mib(rss - idle)}",
                             f"{per_k / 1024:,.2f} (this step {step_k / 1024:,.2f})", f"{db_mib:,.1f}"))
                prev_rss, prev_n, done = rss, target, target
                if cut:
                    break
            elapsed = time.monotonic() - t0
        finally:
            server.stop()
    final = rows[-1]
    return [
        "### 7. Memory footprint",
        "",
        f"`python -m bot serve` in a subprocess; new p2p conversations of one message each, posted at concurrency "
        f"{CONCURRENCY}, zero-latency fake model; VmRSS once every reply of a batch was delivered. "
        f"{done:,} conversations took {elapsed:.0f} s ({done / elapsed:.0f}/s).{cut}",
        "",
        *table(["server state", "replies", "RSS (MiB)", "growth over baseline (MiB)",
                "growth per 1k conversations (MiB)", "database on disk (MiB)"], rows),
        "",
        f"Growth per 1,000 conversations over the baseline after {done:,}: **{final[4].split(' (')[0]} MiB** "
        "(the first batch includes the working set of a busy server: caches, pools, allocator arenas; the "
        "per-step figures after it show the steady growth).",
    ]


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv[1:])))
