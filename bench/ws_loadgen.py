"""The long-connection load generator: the fake long-connection server (tests/fakes/
fake_lark_ws.py) in a process of its own, pushing pre-built events and timing the response
frames — the long connection's counterpart of ``bench/loadgen.py``.

Why a process of its own: the fake Open API and the fake model run on threads of the
benchmark process; a server sharing their interpreter lock would count its own waiting as
the bot's acknowledgement time. Endpoint discovery still goes to the fake Open API at
``LARK_DOMAIN`` (in the benchmark process), which answers with this process's WebSocket URL.

Protocol (JSON lines): prints ``{"port": N}`` once listening; then, per line read from stdin
``{"events": [...], "rate": R, "timeout": T}``, waits for a connection, pushes event i at
start + i / R (open loop, as Lark sends), waits for every response frame, and prints
``{"lat": [seconds...], "codes": [...], "biz": [seconds...], "missing": n}`` (``biz``: the
response's ``biz_rt`` header, the bot's own time from handling the frame to answering it). EOF ends it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.fake_lark_ws import FakeLarkWs  # noqa: E402


async def _pace(ws: FakeLarkWs, payloads: list[bytes], rate: float) -> list[str]:
    t0 = time.monotonic()
    mids, sends = [], []
    for i, payload in enumerate(payloads):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        mid = f"bench_{i}_{t0}"
        mids.append(mid)
        sends.append(asyncio.ensure_future(ws._push(payload, 1, mid, None, "event")))  # noqa: SLF001
    await asyncio.gather(*sends)
    return mids


def main() -> None:
    ws = FakeLarkWs().start()
    print(json.dumps({"port": ws.port}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        ws.wait_connected(1, timeout=60)
        payloads = [json.dumps(e, ensure_ascii=False).encode() for e in cmd["events"]]
        fut = asyncio.run_coroutine_threadsafe(_pace(ws, payloads, float(cmd["rate"])), ws._loop)  # noqa: SLF001
        mids = fut.result(len(payloads) / float(cmd["rate"]) + 60)
        end = time.monotonic() + float(cmd.get("timeout", 30))
        wanted = set(mids)
        while time.monotonic() < end and len({a.message_id for a in ws.acks()} & wanted) < len(mids):
            time.sleep(0.05)
        first = {}
        for a in ws.acks():
            if a.message_id in wanted and a.message_id not in first:
                first[a.message_id] = a
        acks = [first[m] for m in mids if m in first]
        print(json.dumps({"lat": [a.seconds for a in acks], "codes": [a.code for a in acks],
                          # the SDK's biz_rt header: ms from the frame handled to the answer, in the bot
                          "biz": [float(a.headers.get("biz_rt", "nan")) / 1000 for a in acks],
                          "missing": len(mids) - len(acks)}), flush=True)
    ws.stop()


if __name__ == "__main__":
    main()
