"""Long-connection acknowledgement: time from an event pushed over the WebSocket to the bot's
response frame, p50/p99, at 200 events/s (open loop), beside the webhook's acknowledgement
at the same rate in the same run.

Both servers are the real ``python -m bot serve`` in a subprocess against the wire fakes; the
fake model takes 2 s per answer, so replies are being written while events keep arriving.
The long connection is driven by ``bench/ws_loadgen.py`` (the fake long-connection server
in a process of its own, discovered at ``LARK_DOMAIN`` like Lark's); the webhook by
``bench/loadgen.py``. Both time on the sender's side: push written → response frame read,
request sent → HTTP answer read.

    python -m bench.bench_ws_ack [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    APP_ID,
    Fakes,
    Server,
    median,
    ms,
    percentile,
    post_at_rate,
    ratio,
    signed_request,
    table,
    temp_home,
)
from tests.fakes.fake_lark_ws import FAST_CONFIG  # noqa: E402
from tests.fakes.lark_events import make_text_event  # noqa: E402

RATE = 200.0
LARK_LIMIT = 3.0
MODEL_LATENCY = 2.0


class _Endpoint:
    """Plugged into the fake Open API as its long-connection server: discovery answers with
    the WebSocket of the load-generator process."""

    def __init__(self, port: int) -> None:
        self.port = port

    def endpoint(self, body: dict) -> tuple[int, dict, dict]:
        url = f"ws://127.0.0.1:{self.port}/ws/v2?device_id=bench&service_id=7"
        return 200, {"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": dict(FAST_CONFIG)}}, {}


class _WsLoadgen:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.ws_loadgen"], cwd=str(ROOT),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("ws load generator did not start")
        self.port = json.loads(line)["port"]

    def push(self, events: list[dict], rate: float, timeout: float = 30.0) -> dict:
        self.proc.stdin.write(json.dumps({"events": events, "rate": rate, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ws load generator exited with {self.proc.poll()}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _ws_events(n: int, convs: int) -> list[dict]:
    return [make_text_event(f"第 {i} 条消息：帮我想想下周的计划 ({i})", chat_id=f"oc_p2p_ws_{i % convs}",
                            sender=f"ou_ws_{i % convs}", app_id=APP_ID) for i in range(n)]


def _webhook(home: Path, fakes: Fakes, n: int) -> dict:
    home.mkdir()
    server = Server(home, fakes, ethan_shutdown_deadline="0.5")
    try:
        server.start()
        warm = [signed_request("hello", chat_id="oc_p2p_warm_wh", sender="ou_warm")]
        asyncio.run(post_at_rate(server.url + "/lark/events", warm, 1))
        fakes.lark.wait_delivered(fakes.lark.delivered + 1, 30)
        reqs = [signed_request(f"第 {i} 条消息：帮我想想下周的计划 ({i})", chat_id=f"oc_p2p_wh_{i % (n // 5)}",
                               sender=f"ou_wh_{i % (n // 5)}") for i in range(n)]
        cpu0, loop0 = server.cpu_seconds(), server.loop_cpu_seconds()
        lat, statuses = asyncio.run(post_at_rate(server.url + "/lark/events", reqs, RATE))
        cpu, loop_cpu = server.cpu_seconds() - cpu0, server.loop_cpu_seconds() - loop0
    finally:
        server.stop()
    return {"lat": lat, "ok": sum(1 for s in statuses if s == 200), "n": n, "cpu": cpu, "loop_cpu": loop_cpu,
            "missing": 0}


def _long_connection(home: Path, fakes: Fakes, n: int, *, own_thread: bool = False) -> dict:
    home.mkdir()
    gen = _WsLoadgen()
    fakes.lark.ws = _Endpoint(gen.port)
    server = Server(home, fakes, lark_transport="ws", ethan_shutdown_deadline="0.5",
                    ethan_ws_own_thread="true" if own_thread else "false")   # the default: false
    try:
        server.start()                    # /healthz 200 = connected
        before = fakes.lark.delivered
        gen.push(_ws_events(1, 1), 1)
        fakes.lark.wait_delivered(before + 1, 30)
        cpu0, loop0 = server.cpu_seconds(), server.loop_cpu_seconds()
        out = gen.push(_ws_events(n, max(1, n // 5)), RATE)
        cpu, loop_cpu = server.cpu_seconds() - cpu0, server.loop_cpu_seconds() - loop0
    finally:
        server.stop()
        gen.close()
        fakes.lark.ws = None
    return {"lat": out["lat"], "ok": sum(1 for c in out["codes"] if c == 200), "n": n, "cpu": cpu,
            "biz": out.get("biz", []),
            "loop_cpu": loop_cpu, "missing": out["missing"]}


# A bare asyncio process waking at the benchmark's rate: how late a wake-up is, with nothing of
# Ethan in it — on a shared machine, the floor no change to the bot can go below.
FLOOR = """
import asyncio, json, sys, time
async def main(n, rate):
    late, t0 = [], time.monotonic()
    for i in range(n):
        due = t0 + i / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        late.append(time.monotonic() - due)
    print(json.dumps(late))
asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


def _floor(n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", FLOOR, str(n), str(RATE)], capture_output=True, text=True,
                         check=True, timeout=n / RATE + 60)
    return {"lat": json.loads(out.stdout)}


def run(quick: bool = False) -> list[str]:
    n = 200 if quick else 2000
    t0 = time.monotonic()
    with temp_home() as home, Fakes(model_latency=MODEL_LATENCY) as fakes:
        webhook = _webhook(home / "webhook", fakes, n)
        ws = _long_connection(home / "ws", fakes, n)
        ws_thread = _long_connection(home / "ws_thread", fakes, n, own_thread=True)
        floor = _floor(n)

    def row(name: str, r: dict, base_p99: float) -> tuple:
        lat = r["lat"]
        return (name, f"{r['n']:,}", f"{r['ok']:,}", f"{r['missing']}", ms(median(lat)), ms(percentile(lat, 99)),
                ms(max(lat) if lat else float("nan")), f"{sum(1 for x in lat if x > LARK_LIMIT)}",
                ratio(percentile(lat, 99), base_p99), f"{1000 * r['cpu'] / r['n']:.2f}",
                f"{1000 * r['loop_cpu'] / r['n']:.2f}",
                ms(percentile(r["biz"], 99)) if r.get("biz") else "—")

    base = percentile(webhook["lat"], 99)
    rows = [row("**long connection** on the app loop (the default, `ETHAN_WS_OWN_THREAD=false`): push → response frame (code 200)", ws, base),
            row("**long connection** on its own thread (`ETHAN_WS_OWN_THREAD=true`): push → response frame (code 200)", ws_thread, base),
            row("webhook: request → HTTP 200", webhook, base)]
    fl = floor["lat"]
    floor_line = (f"The machine's floor in the same run: a bare asyncio process (no Ethan, no socket) waking "
                  f"{RATE:.0f} times a second is late by p50 {ms(median(fl))} / p99 {ms(percentile(fl, 99))} / "
                  f"max {ms(max(fl))} ms (`uptime` load average {_load()}); no acknowledgement can be faster "
                  "than the process being scheduled.")
    return [
        "### 1b. Long-connection acknowledgement",
        "",
        f"{n:,} events at {RATE:.0f} events/s (open loop: sent on schedule whether or not earlier ones were "
        f"answered, as Lark does), the fake model taking {MODEL_LATENCY:g} s per answer, so replies are "
        "being written meanwhile. The same events, the same rate, one after the other in this run: over the "
        "long connection (the real `lark_oapi.ws.Client` in `ethan serve`; the fake server in its own "
        "process times push written → response frame read) and over the webhook (signed, encrypted POSTs "
        f"from `bench/loadgen.py`). ms; Lark's limit is {LARK_LIMIT:g} s.",
        "",
        *table(["transport", "events", "acked 200", "no answer", "p50", "p99", "max", f"> {LARK_LIMIT:g} s",
                "p99 vs webhook", "server CPU ms/event", "event-loop thread CPU ms/event",
                "in-bot p99 (`biz_rt`)"], rows),
        "",
        "Both acknowledge only after the event is committed to the inbox. Server CPU is every thread of "
        "the process during the pushes (replies to earlier events included); the event-loop thread is the "
        "application loop alone — with `ETHAN_WS_OWN_THREAD=true`, receiving, parsing and answering frames "
        "runs on the lark-ws thread instead; `biz_rt` is the bot's own time from handling a frame to "
        f"answering it (the SDK's header). Run time {time.monotonic() - t0:.0f} s.",
        "",
        floor_line,
    ]


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    print("\n".join(run(p.parse_args().quick)))


if __name__ == "__main__":
    _main()
