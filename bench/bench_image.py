"""Time to answer an image message: a signed, encrypted ``image`` event POSTed to the app
(in process, behind the fake Lark and the fake Anthropic with no model latency) until the
reply reaches the fake Lark — download through the message-resource API, the format check
(decode), base64 (small) or downscale + JPEG (large), the model request carrying the block.
A text message through the same path is the baseline; ``encode`` is ``image_block`` alone.

    python -m bench.bench_image [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _png(w: int, h: int, noisy: bool) -> bytes:
    from PIL import Image

    img = Image.frombytes("RGB", (w, h), os.urandom(w * h * 3)) if noisy else Image.new("RGB", (w, h), (90, 140, 200))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _ms(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1000, xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1000


async def _run(n: int) -> list[str]:
    from bot.media.readers import read_image as image_block
    from tests.fakes.fake_anthropic import Text
    from tests.fakes.lark_events import make_image_event, make_text_event
    from tests.harness import Harness

    cases = [("text (baseline)", None), ("small PNG 64×48 (sent as is)", _png(64, 48, False)),
             ("large PNG 2400×1200, noisy (downscaled)", _png(2400, 1200, True))]
    rows = []
    with tempfile.TemporaryDirectory() as home:
        async with Harness(Path(home)) as h:
            h.model.responder = lambda req: Text("ok")
            for label, data in cases:
                times, encode = [], []
                for i in range(n):
                    chat = f"oc_p2p_bench{i}"
                    if data is None:
                        ev = make_text_event("你好", chat_id=chat, sender=f"ou_b{i}")
                    else:
                        ev = make_image_event(f"img_v3_{i}", chat_id=chat, sender=f"ou_b{i}")
                        h.lark.add_resource(ev["event"]["message"]["message_id"], f"img_v3_{i}", data, "image/png")
                        t = time.perf_counter()
                        image_block(data)
                        encode.append(time.perf_counter() - t)
                    before = len(h.lark.messages())
                    t0 = time.perf_counter()
                    status, _ = await h.post(ev)
                    assert status == 200
                    await h.replies(before + 1, timeout=30)
                    times.append(time.perf_counter() - t0)
                    await h.idle()
                p50, p95 = _ms(times)
                e50 = f"{_ms(encode)[0]:.1f}" if encode else "—"
                size = f"{len(data) / 1024:.0f} KiB" if data else "—"
                rows.append(f"| {label} | {size} | {n} | {p50:.1f} | {p95:.1f} | {e50} |")
    return [
        "Time from POSTing the event to the reply at the fake Lark, ms (fake model answers at once; "
        "in process, so the harness's own work is included alike in every row).",
        "",
        "| message | bytes | n | p50 | p95 | encode p50 |",
        "|:---|---:|---:|---:|---:|---:|",
        *rows,
    ]


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(5 if quick else 20))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    print("\n".join(run(args.quick)))
