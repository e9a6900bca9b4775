"""Run the benchmarks: ``python -m bench`` (``make bench``) or ``python -m bench --quick``
(``make bench-quick``, under a minute, what the test suite runs).

Prints a Markdown report: the machine on top, then one section per benchmark (its tables,
and how long it took). A benchmark that fails prints its error and the others still run;
the exit status is then 1.

    python -m bench                     # everything, full sizes
    python -m bench --quick             # reduced sizes
    python -m bench throughput context  # only these (names as in BENCHMARKS, prefix ok)
    python -m bench --output report.md  # also write the report to a file
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (name, module, title) in report order; each module has run(quick) -> list[str] (Markdown lines)
BENCHMARKS: list[tuple[str, str, str]] = [
    ("webhook_ack", "bench.bench_webhook_ack", "1. Webhook acknowledgement"),
    ("ws_ack", "bench.bench_ws_ack", "1b. Long-connection acknowledgement"),
    ("throughput", "bench.bench_throughput", "2. End-to-end throughput"),
    ("context", "bench.bench_context", "3. Context assembly"),
    ("session_search", "bench.bench_session_search", "4. Session search"),
    ("episode_search", "bench.bench_episode_search", "4b. Episode search"),
    ("recall", "bench.bench_recall", "4c. End-to-end recall and fact decisions"),
    ("prompt_size", "bench.bench_prompt_size", "5. Prompt size over a long conversation"),
    ("consolidation_latency", "bench.bench_consolidation_latency", "6. Reply latency under consolidation"),
    ("footprint", "bench.bench_footprint", "7. Memory footprint"),
    ("cost", "bench.bench_cost", "8. Prompt-cache cost"),
    ("providers", "bench.bench_providers", "9. Model adapters: OpenAI-compatible vs Anthropic"),
    ("image", "bench.bench_image", "10. Answering an image message"),
    ("parse", "bench.bench_parse", "14. Reading attachments: bombs vs normal files"),
    ("pg", "bench.bench_pg", "11. PostgreSQL vs SQLite"),
    ("scale", "bench.bench_scale", "16. Scaling out: replicas × database round trip"),
    ("tools", "bench.bench_tools", "13. The tool port: overhead per call and schema tokens"),
    ("paired", "bench.bench_paired", "12. CPU per message against an older commit, side by side"),
    ("reminders", "bench.bench_reminders", "13. Reminders: due-job pick-up latency and idle CPU"),
    ("group_context", "bench.bench_group_context", "15. The cost of a group's discussion when @-mentioned"),
    ("memory_gate", "bench.bench_memory_gate", "17. The memory-write gate on the event loop"),
]


def _select(names: list[str]) -> list[tuple[str, str, str]]:
    if not names:
        return BENCHMARKS
    chosen = []
    for want in names:
        hits = [b for b in BENCHMARKS if b[0] == want] or [b for b in BENCHMARKS if b[0].startswith(want)]
        if not hits:
            raise SystemExit(f"unknown benchmark {want!r}; choose from: {', '.join(b[0] for b in BENCHMARKS)}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description="Ethan's benchmarks (Markdown report).")
    p.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    p.add_argument("--quick", action="store_true", help="reduced sizes: the whole run in under a minute")
    p.add_argument("--output", type=Path, help="also write the report to this file")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--jobs", type=int, default=0,
                   help="benchmarks run at a time (default: 2 with --quick, else 1; numbers then disturb "
                        "each other)")
    args = p.parse_args(argv)
    if args.list:
        for name, module, title in BENCHMARKS:
            print(f"{name:24} {title}")
        return 0

    from bench.common import machine_lines

    out: list[str] = []

    def emit(lines: list[str]) -> None:
        out.extend(lines)
        print("\n".join(lines), flush=True)

    mode = "quick" if args.quick else "full"
    jobs = args.jobs or (2 if args.quick else 1)
    head = [f"## Ethan benchmarks ({mode})", "", *machine_lines()]
    if jobs > 1:
        head.append(f"- {jobs} benchmarks ran at a time (to keep the quick run short): their numbers "
                    "disturb each other and are not for comparison")
    emit([*head, ""])
    failed: list[str] = []
    t_all = time.perf_counter()
    chosen = _select(args.names)

    def one(item: tuple[str, str, str]) -> list[str]:
        name, module, title = item
        t0 = time.perf_counter()
        try:
            mod = importlib.import_module(module)
            lines = list(mod.run(args.quick))
            if not lines or not lines[0].startswith("#"):
                lines = [f"### {title}", "", *lines]
        except Exception as e:  # one benchmark failing must not hide the others
            failed.append(name)
            tb = traceback.format_exc(limit=8)
            lines = [f"### {title}", "", f"**FAILED**: `{type(e).__name__}: {str(e)[:300]}`", "", "```",
                     tb.rstrip(), "```"]
        return [*lines, "", f"_{name}: {time.perf_counter() - t0:.1f} s_", ""]

    if jobs == 1:
        for item in chosen:
            emit(one(item))
    else:
        # modules are imported up front, one at a time (imports are not thread-safe to race)
        for _, module, _ in chosen:
            try:
                importlib.import_module(module)
            except Exception:  # reported by one() when it runs
                pass
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, item) for item in chosen]
            for fut in futures:        # report order, whatever order they finish in
                emit(fut.result())
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    emit([f"Total: {time.perf_counter() - t_all:.0f} s"
          + (f"; load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}" if load else "")
          + (f". Failed: {', '.join(failed)}" if failed else ".")])
    if args.output:
        args.output.write_text("\n".join(out) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
