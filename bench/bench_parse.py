"""Reading an attachment in the parse pool (bot/media/parse_pool.py): the generated bombs of issue 32
(tests/reliability/bombs.py) side by side with ordinary files of the same kinds. Each row is
``ParsePool.run`` from the caller's side — the pipe both ways, the reader in the worker, its
limits — with the default limits and one warm worker; the outcome is what the user would get.

    python -m bench.bench_parse [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _normal() -> list[tuple[str, str, bytes]]:
    from tests.e2e.test_lark_rich import _docx, _xlsx, pdf_with_text, png

    return [("normal: notes.txt (20 KB)", "notes.txt", ("一行笔记 line of notes\n" * 700).encode()),
            ("normal: report.pdf (1 page)", "report.pdf", pdf_with_text("Quarterly revenue grew 42 percent")),
            ("normal: review.docx", "review.docx", _docx()),
            ("normal: sales.xlsx", "sales.xlsx", _xlsx()),
            ("normal: photo.png 64×48", "photo.png", png(64, 48))]


async def _run(n: int) -> list[str]:
    from bot.media.parse_pool import ParseFailed, ParsePool
    from tests.reliability import bombs

    cases = _normal() + [(f"bomb: {key}", name, build()) for key, (name, build) in bombs.BOMBS.items()]
    pool = ParsePool()
    rows = []
    try:
        await pool.run("file", "warm.txt", b"warm", 30_000)
        for label, name, data in cases:
            times, outcome = [], ""
            for _ in range(n):
                t0 = time.perf_counter()
                try:
                    if name.endswith(".png"):
                        await pool.run("image", data)
                        outcome = "image block"
                    else:
                        text, cut = await pool.run("file", name, data, 30_000)
                        outcome = f"{len(text):,} chars" + (" (cut)" if cut else "")
                except ParseFailed as e:
                    outcome = f"refused: {e.reason} ({e.cause})"
                times.append(time.perf_counter() - t0)
            rows.append(f"| {label} | {len(data):,} | {statistics.median(times) * 1000:.1f} | "
                        f"{max(times) * 1000:.1f} | {outcome} |")
    finally:
        await pool.stop()
    return [
        f"Time of one `ParsePool.run` (default limits, warm worker), ms, {n} each:",
        "",
        "| file | bytes | p50 | max | outcome |",
        "|:---|---:|---:|---:|:---|",
        *rows,
    ]


async def _fair(timeout: float, rounds: int) -> list[str]:
    """Bob's small file through the pool (default workers and CPU limit, ``timeout`` wall clock)
    alone, then 0.3 s after Alice's slow PDFs (30 text-less pages of their own streams, ~9 s of
    CPU: killed at ``timeout``) arrived from 2 and from 4 chats at once. Works on a tree before
    the fix too (no ``key``: one queue for everyone), for the baseline."""
    from bot.media.parse_pool import ParseFailed, ParseLimits, ParsePool
    from tests.reliability import bombs

    pool = ParsePool(ParseLimits(timeout=timeout))
    keyed = "key" in inspect.signature(pool.run).parameters

    async def read(who: str, name: str, data: bytes) -> tuple[float, str]:
        t0 = time.perf_counter()
        try:
            await (pool.run("file", name, data, 30_000, key=who) if keyed
                   else pool.run("file", name, data, 30_000))
            outcome = "read"
        except ParseFailed as e:
            outcome = e.cause
        return time.perf_counter() - t0, outcome

    slow = bombs.textless_pdf(pages=30, ops=15_000, shared=False)
    small = ("鲍勃的笔记 Bob's notes\n" * 50).encode()
    rows = []
    try:
        for chats in (0, 2, 4):
            bob, bob_seen, alice = [], set(), []
            for _ in range(rounds):
                # Both workers up (a killed one is replaced at the next job): a worker's start-up
                # is not what is measured.
                await asyncio.gather(read("warm1", "w.txt", b"w"), read("warm2", "w.txt", b"w"))
                tasks = [asyncio.create_task(read("ou_alice", "slow.pdf", slow)) for _ in range(chats)]
                if tasks:
                    await asyncio.sleep(0.3)       # her files are in the pool
                took, outcome = await read("ou_bob", "notes.txt", small)
                bob.append(took)
                bob_seen.add(outcome)
                alice += await asyncio.gather(*tasks)
            seen = sorted({o for _, o in alice})
            rows.append(f"| {'nothing else' if not chats else f'Alice: a slow PDF from each of {chats} chats'} | "
                        f"{statistics.median(bob) * 1000:.1f} | {max(bob) * 1000:.1f} | {', '.join(sorted(bob_seen))} | "
                        + (f"{max(t for t, _ in alice):.1f} s, {', '.join(seen)}" if alice else "—") + " |")
    finally:
        await pool.stop()
    return [
        f"Bob's small file while Alice's files run to the {timeout:g} s wall clock "
        f"({'fair per sender' if keyed else 'one shared queue'}), ms, {rounds} rounds:",
        "",
        "| meanwhile | Bob p50 | Bob max | Bob's outcome | Alice's slowest, outcomes |",
        "|:---|---:|---:|:---|:---|",
        *rows,
    ]


def run(quick: bool = False) -> list[str]:
    lines = asyncio.run(_run(2 if quick else 5))
    if not quick:
        lines += ["", *asyncio.run(_fair(5.0, 3))]
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--fair", action="store_true", help="only the fairness table")
    p.add_argument("--timeout", type=float, default=5.0, help="the parse wall clock for --fair (s)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print("\n".join(asyncio.run(_fair(args.timeout, args.rounds)) if args.fair else run(args.quick)))
