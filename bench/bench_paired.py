"""The reply path's CPU against an older commit, side by side in one run: the end-to-end
throughput benchmark (bench_throughput's ``_e2e``: signed, encrypted webhooks in, replies out
at the fake Lark, zero-latency fake model, server CPU read from /proc) run alternately on this
checkout and on ``BASELINE`` checked out as a git worktree, so both see the same machine at the
same moment. Reports messages/s and server CPU ms per message for each, and the ratio
(this / baseline) of the medians: CPU per message must not grow (≤ 1.00×).

    python -m bench.bench_paired [--quick] [--base REV] [--rounds N]

The baseline's server runs with ``PYTHONPATH`` at its worktree (the fakes and the load
generator are this checkout's), in this venv: a baseline that needs a dependency this one
lacks will not start — pick a newer one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_throughput import _e2e  # noqa: E402
from bench.common import median, table  # noqa: E402

# The end of round 2 (the last landing before the PostgreSQL and replica work): the code
# issue 29 compares CPU per message against.
BASELINE = "787f73b"


def _worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    return where


def _drop_worktree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)


def paired(base: str, rounds: int, convs: int, per_conv: int, concurrency: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="ethan-baseline-") as tmp:
        tree = _worktree(base, Path(tmp) / "tree")
        try:
            for i in range(rounds):
                # alternate which goes first, so a drift of the machine favours neither
                order = [("baseline", {"pythonpath": str(tree)}), ("this", {})]
                for name, env in (order if i % 2 == 0 else order[::-1]):
                    results[name].append(_e2e(convs, per_conv, concurrency, None, **env))
        finally:
            _drop_worktree(tree)
    return results


def run(quick: bool = False, base: str = BASELINE, rounds: int | None = None) -> list[str]:
    rounds = rounds or (1 if quick else 5)
    convs, per_conv = (5, 2) if quick else (40, 10)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    res = paired(base, rounds, convs, per_conv, concurrency=32)
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
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--base", default=BASELINE)
    ap.add_argument("--rounds", type=int)
    a = ap.parse_args()
    print("\n".join(run(a.quick, a.base, a.rounds)))
