"""The cost of the group's discussion when Ethan is @-mentioned (issue 25): the same
@-message after the same discussion, answered with ``ETHAN_GROUP_CONTEXT_TOKENS=0`` (the
@-message alone) and with the default (2000), in one run, side by side. Prompt tokens are the
fake model's estimate of each request (``RecordedRequest.input_tokens``); latency is from
POSTing the signed, encrypted event to the reply at the fake Lark (fake model answers at once,
so the difference is the message-list call(s), the name lookups and the longer request).

    python -m bench.bench_group_context [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPEAKERS = ["ou_alice", "ou_bob", "ou_carol", "ou_dave"]
LINE = "我觉得这个方案还要再看一下，尤其是数据库迁移和回滚的步骤，周五之前定下来"


async def _case(budget: int, n: int, discussion: int) -> tuple[list[float], list[int], int]:
    from tests.fakes.fake_anthropic import Text
    from tests.fakes.lark_events import make_text_event
    from tests.harness import Harness

    times, tokens = [], []
    with tempfile.TemporaryDirectory() as home:
        async with Harness(Path(home), ethan_group_context_tokens=budget) as h:
            h.model.responder = lambda req: Text("好的。")
            for i in range(n + 1):          # the first is a warm-up, not counted
                chat = f"oc_bench_group_{i}"
                t0 = int(time.time() * 1000) - 600_000
                for j in range(discussion):
                    h.lark.add_message(f"om_b{i}_{j}", chat, text=f"{LINE} ({j})",
                                       sender=SPEAKERS[j % len(SPEAKERS)], create_ms=t0 + j * 1000)
                ev = make_text_event("总结一下上面的讨论", chat_id=chat, chat_type="group",
                                     sender="ou_erin", mentions=["ou_bot"])
                before = len(h.lark.messages())
                start = time.perf_counter()
                status, _ = await h.post(ev)
                assert status == 200
                await h.replies(before + 1, timeout=30)
                elapsed = time.perf_counter() - start
                req = h.model.chat_requests()[-1]
                if i:
                    times.append(elapsed)
                    tokens.append((req.input_tokens, _cjk_aware(req.json)))
                await h.idle()
            pages = h.lark.list_pages
    return times, tokens, pages * n / (n + 1)


def _cjk_aware(body: dict) -> int:
    """Ethan's own estimate (memory.text.tokens.estimate_tokens, CJK-aware) of the request's text:
    the fake's chars/4 understates Chinese ~2.5×."""
    import json

    from memory.text.tokens import estimate_tokens

    return estimate_tokens(json.dumps([body.get("system"), body.get("messages")], ensure_ascii=False))


async def _run(n: int, discussion: int) -> list[str]:
    rows = []
    for label, budget in (("@-message alone (ETHAN_GROUP_CONTEXT_TOKENS=0)", 0),
                          ("with the discussion (default 2000)", 2000)):
        times, tokens, pages = await _case(budget, n, discussion)
        xs = sorted(times)
        rows.append((label, statistics.median(t for t, _ in tokens), statistics.median(c for _, c in tokens),
                     statistics.median(xs) * 1000,
                     xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1000, pages / n))
    base_tok, base_ms = rows[0][1], rows[0][3]
    return [
        f"{discussion} earlier messages by {len(SPEAKERS)} people, then one @-message; n={n} per row, "
        "fake model and fake Lark in process, both rows in this run.",
        "",
        "| request | prompt tokens p50 (fake, chars/4) | × | Ethan's CJK-aware estimate | latency p50 ms | p95 ms | Δ p50 ms | list pages / answer |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {label} | {tok:.0f} | {tok / base_tok:.2f} | {cjk:.0f} | {p50:.1f} | {p95:.1f} | {p50 - base_ms:+.1f} | {pg:.1f} |"
          for label, tok, cjk, p50, p95, pg in rows),
    ]


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(5 if quick else 20, 30))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    print("\n".join(run(args.quick)))
