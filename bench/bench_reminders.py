"""Reminders: due-job pick-up latency and the scheduler's idle CPU (issue 27).

The real scheduler (bot/scheduler.py) over the real schedule store (memory/schedules.py) on
SQLite, with N jobs pending (due next week) and a stream of jobs falling due every 50 ms.
Pick-up latency is the time from a job's due time to its send request (the moment the
scheduler calls the Lark sender; the send itself is Lark's). Idle CPU: the process's CPU time
(every thread, the database's too) while the scheduler waits with N jobs pending and none due,
as a share of one core, and how many times it woke up.

    python -m bench.bench_reminders [--quick]      # target: p99 < 1 s at 10,000 pending
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import ms, percentile, table  # noqa: E402
from bot.scheduler import Scheduler  # noqa: E402
from storage import Database  # noqa: E402
from storage.sqlite import SqliteDatabase
from memory.schedules import ScheduleStore  # noqa: E402

TZ = "UTC"


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


async def _fill(db: Database, n: int, start: float) -> None:
    rows = [(f"ou_{i}", f"oc_{i % 500}", "p2p", f"pending {i}", TZ, _iso(start + 7 * 86400 + i),
             start + 7 * 86400 + i, start, start) for i in range(n)]

    def insert(conn, rows):
        conn.executemany("INSERT INTO schedules(owner_id, chat_id, chat_type, text, tz, dtstart, next_due,"
                         " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)", rows)
    for i in range(0, n, 2000):
        await db.write(insert, rows[i:i + 2000])


async def _run(pending: int, due_jobs: int, idle_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="ethan-bench-rem-") as home:
        db = await SqliteDatabase(Path(home) / "ethan.db").open()
        try:
            store = ScheduleStore(db)
            now = time.time()
            await _fill(db, pending, now)
            sent: dict[str, float] = {}

            async def deliver(job, text, uuid):
                sent[uuid] = time.time() - (job.next_due or 0)
                return "om_bench"

            sched = Scheduler(store, deliver, grace_s=3600)
            sched.start()
            # idle: nothing due for a while
            await asyncio.sleep(0.5)
            ticks0, cpu0, wall0 = sched.ticks, time.process_time(), time.monotonic()
            await asyncio.sleep(idle_s)
            idle_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
            idle_ticks = sched.ticks - ticks0
            # jobs falling due every 50 ms, stored through the store (the scheduler is woken)
            first = int(time.time()) + 2
            for i in range(due_jobs):
                await store.add(owner_id=f"ou_due_{i}", chat_id="oc_due", chat_type="p2p", text=f"due {i}",
                                tz=TZ, dtstart=_iso(first + i // 20) + f".{(i % 20) * 5:02d}0000")
                sched.wake()
            deadline = time.monotonic() + 30 + due_jobs * 0.05
            while len(sent) < due_jobs and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await sched.idle()
            await sched.stop()
            lat = sorted(sent.values())
            return {"pending": pending, "due": due_jobs, "sent": len(sent), "p50": percentile(lat, 50),
                    "p99": percentile(lat, 99), "max": lat[-1] if lat else float("nan"),
                    "idle_cpu": idle_cpu, "idle_ticks": idle_ticks, "idle_s": idle_s}
        finally:
            await db.close()


def run(quick: bool = False) -> list[str]:
    sizes = [(1000, 60, 3.0)] if quick else [(1000, 200, 10.0), (10_000, 200, 10.0)]
    rows = []
    for pending, due, idle in sizes:
        r = asyncio.run(_run(pending, due, idle))
        rows.append((f"{r['pending']:,}", f"{r['sent']}/{r['due']}", ms(r["p50"]), ms(r["p99"]), ms(r["max"]),
                     f"{r['idle_cpu'] * 100:.2f} %", f"{r['idle_ticks']} in {r['idle_s']:g} s"))
    return [*table(("pending jobs", "delivered", "pick-up p50 (ms)", "pick-up p99 (ms)", "max (ms)",
                    "idle CPU (one core)", "idle wake-ups"), rows),
            "",
            "Pick-up: from a job's due time to the scheduler's send request (target p99 < 1 s at 10,000 "
            "pending). Idle: the whole process while the scheduler sleeps with the jobs pending; it wakes "
            "at the next due time or every 30 s (to see jobs other replicas stored)."]


if __name__ == "__main__":
    print("\n".join(run("--quick" in sys.argv)))
