"""The tree itself: a clone holds everything its tests use, no built package is committed, and
the product code is pyflakes-clean (an unused import or a placeholder-less f-string is a bug
that reads as intent). Read from the files, so a regression fails here, not in review."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# Spellings of a path that leaves the repository: ../ climbing, an absolute /work/… path, or a
# sibling folder the CI machine happens to have beside the clone.
_OUTSIDE = [re.compile(r"""["'](?:\.\./)+"""), re.compile(r"""["']/work/"""),
            re.compile(r"""\bshared\s*/\s*["']?fixtures""")]
_PARENTS = re.compile(r"parents\[(\d+)\]")


def _test_sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__).resolve())


def test_no_test_reads_outside_the_repository():
    bad = []
    for path in _test_sources():
        rel = path.relative_to(ROOT)
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(rx.search(line) for rx in _OUTSIDE):
                bad.append(f"{rel}:{n}: {line.strip()}")
            for m in _PARENTS.finditer(line):
                # Path(__file__).parents[k] is the repository's root at k = depth - 1
                if int(m.group(1)) > len(rel.parts) - 1:
                    bad.append(f"{rel}:{n}: parents[{m.group(1)}] is above the repository: {line.strip()}")
    assert not bad, "tests must read only the repository (copy what they need into tests/):\n" + "\n".join(bad)


def test_the_lark_fixtures_are_in_the_repository():
    from tests.fakes.lark_events import FIXTURES_DIR
    assert FIXTURES_DIR.is_relative_to(ROOT) and (FIXTURES_DIR / "p2p_text.json").is_file()


def test_no_built_package_is_committed():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    assert not [f for f in files if re.search(r"\.(whl|egg|tar\.gz)$", f)]


def test_product_code_is_pyflakes_clean():
    out = subprocess.run([sys.executable, "-m", "pyflakes", "bot", "memory", "storage", "bench"], cwd=ROOT,
                         capture_output=True, text=True)
    problems = []
    for line in (out.stdout + out.stderr).splitlines():
        m = re.match(r"(.+?):(\d+):", line)
        if m:      # a line marked `# noqa` (a deliberate re-export, an import for its effect) is fine
            src = (ROOT / m.group(1)).read_text().splitlines()[int(m.group(2)) - 1]
            if "noqa" in src:
                continue
        problems.append(line)
    assert not problems, "\n".join(problems)
