"""The benchmarks must keep running: `python -m bench --quick` once, end to end.

No timing assertions (speed is reported by the benchmarks, never asserted in tests):
only that every benchmark ran and printed its Markdown tables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)     # ~100 s alone; every benchmark starts servers, slower under the suite's load
def test_quick_benchmarks_run_and_print_tables(tmp_path):
    from bench.__main__ import BENCHMARKS

    report = tmp_path / "report.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LARK_", "ANTHROPIC_", "ETHAN_"))}
    env["ETHAN_HOME"] = str(tmp_path / "home")      # benchmarks make their own; nothing lands here
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(report)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout ---\n{out[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    assert "**FAILED**" not in out, out[-6000:]
    assert out.startswith("## Ethan benchmarks (quick)")
    assert "- CPU:" in out and "SQLite" in out and "- date:" in out
    for name, _module, _what in BENCHMARKS:
        assert f"_{name}: " in out, f"{name} did not report\n{out[-4000:]}"
    sections = [s for s in out.split("\n### ")[1:]]
    assert len(sections) >= len(BENCHMARKS), out[-4000:]
    for section in sections:
        title = section.splitlines()[0]
        assert "|---" in section or "|:---" in section, f"section {title!r} printed no table"
        rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
        assert len(rows) >= 2, f"section {title!r} has a table without rows"
    assert report.read_text(encoding="utf-8").strip() == out.strip()
