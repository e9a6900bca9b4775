"""Reading an attachment in the parse pool (bot/parse_pool.py): the generated bombs of issue 32
(tests/reliability/bombs.py) side by side with ordinary files of the same kinds. Each row is
``ParsePool.run`` from the caller's side — the pipe both ways, the reader in the worker, its
limits — with the default limits and one warm worker; the outcome is what the user would get.

    python -m bench.bench_parse [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
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
    from bot.parse_pool import ParseFailed, ParsePool
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


def run(quick: bool = False) -> list[str]:
    return asyncio.run(_run(2 if quick else 5))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    print("\n".join(run(args.quick)))
