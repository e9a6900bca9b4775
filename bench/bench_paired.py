"""The reply path's CPU against an older commit, side by side in one run: the end-to-end
throughput benchmark (bench_throughput's ``_e2e``: signed, encrypted webhooks in, replies out
at the fake Lark, zero-latency fake model, server CPU read from /proc) run alternately on this
checkout and on ``BASELINE`` checked out as a git worktree, so both see the same machine at the
same moment. Reports messages/s and server CPU ms per message for each, and the ratio
(this / baseline) of the medians: CPU per message must not grow (≤ 1.00×).

CPU seconds on this shared 2-core VM move ±10–15 % from one run to the next (the host's other
guests; ``perf`` has no hardware counters here), so the same pair is also counted in machine
instructions: each server once more under ``valgrind --tool=callgrind`` with instrumentation
off through start-up and the warm-up, switched on (``callgrind_control -i on``) for a fixed
load and dumped after it. Instructions per message repeat to ±0.5 % whatever else the machine
does; they are the number to compare (they miss cache and lock effects, which the timed rounds
still show). Skipped with a note where valgrind is not installed, and in ``--quick``.

    python -m bench.bench_paired [--quick] [--base REV] [--rounds N] [--counted N]

The baseline's server runs with ``PYTHONPATH`` at its worktree (the fakes and the load
generator are this checkout's), in this venv: a baseline that needs a dependency this one
lacks will not start — pick a newer one.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_throughput import _e2e, _requests  # noqa: E402
from bench.common import Fakes, Server, median, post_all, signed_request, table, temp_home  # noqa: E402

# The end of round 2 (the last landing before the PostgreSQL and replica work): the code
# issue 29 compares CPU per message against.
BASELINE = "787f73b"


def _worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    return where


def _drop_worktree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


class CountedServer(Server):
    """The server under callgrind, instrumentation off until ``count_on``."""

    def command(self) -> list[str]:
        self.out = self.home / "callgrind.out"
        return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out}",
                *super().command()]

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True, capture_output=True)

    def count_on(self) -> None:
        self._control("-i", "on")

    def count_off(self) -> int:
        """Dump, switch off, and return the instructions counted since ``count_on``."""
        self._control("-d")
        self._control("-i", "off")
        total = 0
        for path in glob.glob(f"{self.out}*"):
            for line in open(path, encoding="utf-8", errors="replace"):
                if line.startswith("totals:"):
                    total += int(line.split()[1])
                    break
        return total


def counted(convs: int, per_conv: int, **env: str) -> float:
    """Machine instructions the server executes per answered message (all its threads),
    warm-up excluded, the same load as a timed round at 8 in flight (valgrind is ~50× slower)."""
    with temp_home("ethan-bench-counted-") as home, Fakes() as fakes:
        server = CountedServer(home, fakes, **env).start(timeout=600)
        try:
            warm = [signed_request(f"hello {i}", chat_id=f"oc_p2p_warm{i}", sender=f"ou_warm{i}")
                    for i in range(3)]
            asyncio.run(post_all(server.url + "/lark/events", warm, 1))
            fakes.lark.wait_delivered(len(warm), 300)
            time.sleep(2)       # the warm-up's consolidation runs uncounted
            reqs = _requests(convs, per_conv)
            server.count_on()
            asyncio.run(post_all(server.url + "/lark/events", reqs, 8))
            fakes.lark.wait_delivered(len(reqs) + len(warm), 600)
            time.sleep(3)       # and this load's is counted: each reply's follow-up work
            return server.count_off() / len(reqs)
        finally:
            server.stop()


def paired(base: str, rounds: int, convs: int, per_conv: int, concurrency: int,
           counts: int = 0) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    results: dict[str, list[dict]] = {"baseline": [], "this": []}
    instructions: dict[str, list[float]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="ethan-baseline-") as tmp:
        tree = _worktree(base, Path(tmp) / "tree")
        order = [("baseline", {"pythonpath": str(tree)}), ("this", {})]
        try:
            for i in range(rounds):
                # alternate which goes first, so a drift of the machine favours neither
                for name, env in (order if i % 2 == 0 else order[::-1]):
                    results[name].append(_e2e(convs, per_conv, concurrency, None, **env))
            for i in range(counts):
                for name, env in (order if i % 2 == 0 else order[::-1]):
                    instructions[name].append(counted(10, 4, **env))
        finally:
            _drop_worktree(tree)
    return results, instructions


def run(quick: bool = False, base: str = BASELINE, rounds: int | None = None,
        counts: int | None = None) -> list[str]:
    rounds = rounds or (1 if quick else 5)
    convs, per_conv = (5, 2) if quick else (40, 10)
    have_valgrind = bool(shutil.which("valgrind") and shutil.which("callgrind_control"))
    counts = (0 if quick else 2) if counts is None else counts
    counts = counts if have_valgrind else 0
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    res, instr = paired(base, rounds, convs, per_conv, concurrency=32, counts=counts)
    rows, med = [], {}
    for name, runs in res.items():
        per_msg = [r["cpu"] / max(1, r["delivered"]) * 1000 for r in runs]
        rate = [r["delivered"] / r["wall"] for r in runs]
        bad = sum(r["bad"] for r in runs) + sum(r["messages"] - r["delivered"] for r in runs)
        med[name] = (median(per_msg), median(rate))
        label = f"{name} ({base if name == 'baseline' else rev})"
        rows.append([label, f"{med[name][1]:.0f}", f"{med[name][0]:.2f}",
                     ", ".join(f"{x:.2f}" for x in per_msg), str(bad)])
    cpu_ratio = med["this"][0] / med["baseline"][0]
    rate_ratio = med["this"][1] / med["baseline"][1]
    out = [f"{rounds} alternating rounds of {convs} chats × {per_conv} messages each, same machine, same run.", ""]
    out += table(["code", "msg/s (median)", "server CPU ms/msg (median)", "CPU ms/msg per run", "lost/non-200"], rows)
    out += ["", f"**CPU per message: {cpu_ratio:.2f}× the baseline** (target ≤ 1.00×); "
                f"messages/s {rate_ratio:.2f}× the baseline."]
    if counts:
        rows = [[f"{name} ({base if name == 'baseline' else rev})", f"{median(v) / 1e6:.2f}",
                 ", ".join(f"{x / 1e6:.2f}" for x in v)] for name, v in instr.items()]
        out += ["", f"Counted: {counts} alternating runs each under callgrind, 10 chats × 4 messages "
                    "(warm-up uncounted), server instructions in all its threads.", ""]
        out += table(["code", "M instructions/msg (median)", "per run"], rows)
        out += ["", f"**Instructions per message: {median(instr['this']) / median(instr['baseline']):.3f}× "
                    "the baseline** (deterministic to ±0.5 %; target ≤ 1.00×)."]
    else:
        why = "not installed" if not have_valgrind else "not asked for (--quick or --counted 0)"
        out += ["", f"Instruction counts (callgrind): {why}."]
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--base", default=BASELINE)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--counted", type=int, help="callgrind runs per side (default 2, 0 in --quick)")
    a = ap.parse_args()
    print("\n".join(run(a.quick, a.base, a.rounds, a.counted)))
