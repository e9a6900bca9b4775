"""Reminders: due-job pick-up latency and the scheduler's idle CPU (issue 27).

The real scheduler (bot/schedules/scheduler.py) over the real schedule store (memory/schedules/store.py) on
SQLite, with N jobs pending (due next week) and a stream of jobs falling due every 50 ms.
Pick-up latency is the time from a job's due time to its send request (the moment the
scheduler calls the Lark sender; the send itself is Lark's). Idle CPU: the process's CPU time
(every thread, the database's too) while the scheduler waits with N jobs pending and none due,
as a share of one core, and how many times it woke up.

    python -m bench.bench_reminders [--quick]      # target: p99 < 1 s at 10,000 pending
    python -m bench.bench_reminders --hostile      # another chat's ack while a hostile rule is checked

``--hostile`` (issue 45 N1): ``ethan serve`` behind the fakes; the fake model answers one chat's
message with ``schedule_message`` and a hostile RRULE (one that never occurs, in three forms)
or a plain weekly one, and 0.2 s after that call another chat sends 50 events at 10 a second
(open loop, as Lark sends). Reported: that chat's acknowledgement p50 / max (Lark allows 3 s),
how long the tool call took (model's tool call → its result back at the model) and what the
user was told. Run it in this tree and in a worktree of the baseline (the same file copied
there) for the before / after table in bench/README.md.
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
from bot.schedules.scheduler import Scheduler  # noqa: E402
from storage import Database  # noqa: E402
from storage.sqlite import SqliteDatabase
from memory.schedules.store import ScheduleStore  # noqa: E402

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


# ---- a hostile rule and another chat's acknowledgement (issue 45 N1) ------------------------

HOSTILE_RULES = (("weekly (control)", "FREQ=WEEKLY;BYDAY=MO"),
                 ("never, HOURLY", "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30"),
                 ("never, DAILY", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30"),
                 ("never, HOURLY + BY lists", "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30;BYHOUR=1,2;BYMINUTE=1,2,3;BYSECOND=1,2"))


def _hostile_one(rule: str) -> dict:
    import threading

    from bench.common import Fakes, Server, post_at_rate, signed_request, temp_home
    from tests.fakes.fake_anthropic import Text, ToolUse, last_user_text, tool_results

    called, answered = threading.Event(), {}

    def responder(req: dict):
        results = tool_results(req)
        if results:
            content = results[0].get("content")
            text = content if isinstance(content, str) else " ".join(b.get("text", "") for b in content or [])
            answered.setdefault("at", time.monotonic())
            answered.setdefault("text", text)
            return Text("ok")
        if "rule:" in last_user_text(req):
            called.set()
            answered["called"] = time.monotonic()
            at = time.strftime("%Y-%m-%dT09:00", time.gmtime(time.time() + 2 * 86400))
            return ToolUse("schedule_message", {"text": "ping", "at": at, "rrule": rule})
        return Text("hello")

    with temp_home() as home, Fakes() as fakes:
        fakes.model.responder = responder
        server = Server(home, fakes, ethan_shutdown_deadline="0.5", ethan_timezone="UTC")
        server.launch()
        try:
            server.wait_healthy()
            url = server.url + "/lark/events"
            asyncio.run(post_at_rate(url, [signed_request("hello", chat_id="oc_p2p_warm", sender="ou_warm")], 1))
            fakes.lark.wait_delivered(1, 30)
            asyncio.run(post_at_rate(url, [signed_request("remind me rule:x", chat_id="oc_p2p_hostile",
                                                          sender="ou_hostile")], 1))
            called.wait(30)
            time.sleep(0.2)
            others = [signed_request(f"message {i}", chat_id="oc_p2p_other", sender="ou_other") for i in range(50)]
            lat, statuses = asyncio.run(post_at_rate(url, others, 10.0))
            deadline = time.monotonic() + 60
            while "at" not in answered and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            server.stop()
    lat = sorted(lat)
    text = answered.get("text", "")
    told = ("refused: never occurs" if "no occurrence" in text else "refused: hourly" if "hourly" in text
            else "refused: past" if "in the past" in text else "scheduled" if "scheduled reminder" in text
            else (text[:40] or "no answer"))
    return {"p50": percentile(lat, 50), "max": lat[-1], "ok": sum(s == 200 for s in statuses), "n": len(others),
            "tool_s": answered.get("at", float("nan")) - answered.get("called", float("nan")), "told": told}


def hostile() -> list[str]:
    rows = []
    for name, rule in HOSTILE_RULES:
        r = _hostile_one(rule)
        rows.append((name, f"{r['ok']}/{r['n']}", ms(r["p50"]), ms(r["max"]), f"{r['tool_s']:.2f}", r["told"]))
    return [*table(("rule", "other chat acked", "ack p50 (ms)", "ack max (ms)", "tool call (s)", "user told"), rows),
            "",
            "Another chat's 50 events at 10/s start 0.2 s after the model's schedule_message call; "
            "Lark re-sends an event not acknowledged within 3 s."]


if __name__ == "__main__":
    if "--hostile" in sys.argv:
        print("\n".join(hostile()))
    else:
        print("\n".join(run("--quick" in sys.argv)))
